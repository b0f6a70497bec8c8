// engine/decoding-params.json, the decoding parameters' one definition, compiled in as a string literal by
// CMake (generated/decoding_table.inc): the engine needs no file beside it at run time.
#pragma once

namespace a2d {
inline constexpr const char* kDecodingTableJson =
#include "decoding_table.inc"
    ;
}  // namespace a2d
