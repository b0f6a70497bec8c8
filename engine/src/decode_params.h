// The decoding parameters of docs/decoding.md as the engine checks them. Their names, ranges, choices and
// defaults come from engine/decoding-params.json (embedded at build time), which the TypeScript mirror, the
// server and the converter read too; the cross-field rules are coded here and held to the file's shared
// cases by a test.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config.h"

namespace a2d {

struct ParamSpec {
  std::string name;
  std::string type;  // "integer" | "number" | "choice"
  double min = 0.0;
  bool min_exclusive = false;
  std::string max;  // "" (none), a number, "block_size" or "2^64-1"
  std::vector<std::string> choices;
  bool has_default = false;
  double default_number = 0.0;
  std::string default_choice;
};

// Every entry of the table's "parameters" and "request_parameters", in its order.
const std::vector<ParamSpec>& decoding_specs();
// The entry named `name`; throws std::logic_error when there is none.
const ParamSpec& decoding_spec(const std::string& name);

// "" when `value` is in the entry's range (block_size: the block size it is checked with), otherwise what
// it must be ("in [0, 1]", ...).
std::string range_problem(const ParamSpec& spec, double value, int block_size);

// The index of `value` among the entry's choices, or -1.
int choice_index(const ParamSpec& spec, const std::string& value);
// "one of a, b, c" (with the reason, for a retired remasking rule).
std::string choice_problem(const ParamSpec& spec, const std::string& value);

// The id of the first cross-field rule of the table the parameters break, or "" (and its message).
std::string broken_rule(const DecodeParams& params);
const std::string& rule_message(const std::string& id);

// The names docs/decoding.md gives the choices ("low_confidence", "block", "fused", ...): the table's.
const char* remasking_name(Remasking remasking);
const char* advance_name(Advance advance);
const char* commit_name(CommitPolicy commit);
const char* reveal_order_name(RevealOrder order);
bool parse_remasking(const std::string& name, Remasking* out);
bool parse_advance(const std::string& name, Advance* out);
bool parse_commit(const std::string& name, CommitPolicy* out);
bool parse_reveal_order(const std::string& name, RevealOrder* out);

// Checks decoding parameters against the table and its rules; throws std::runtime_error naming the
// parameter (or rule) and what it must be.
void validate_decode_params(const DecodeParams& params, const ModelConfig& config);

}  // namespace a2d
