#include "decode_params.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "decoding_table.h"

namespace a2d {

namespace {

using nlohmann::json;

struct Table {
  std::vector<ParamSpec> specs;
  std::vector<std::pair<std::string, std::string>> rules;  // (id, message)
};

std::string number_text(double x) {
  std::string s = json(x).dump();
  if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
  return s;
}

const Table& table() {
  static const Table parsed = [] {
    const json root = json::parse(kDecodingTableJson);
    Table t;
    for (const char* group : {"parameters", "request_parameters"}) {
      for (const json& p : root.at(group)) {
        ParamSpec spec;
        spec.name = p.at("name").get<std::string>();
        spec.type = p.at("type").get<std::string>();
        if (spec.type == "choice") {
          spec.choices = p.at("choices").get<std::vector<std::string>>();
        } else {
          spec.min = p.at("min").get<double>();
          spec.min_exclusive = p.value("min_exclusive", false);
          if (p.contains("max")) spec.max = p.at("max").is_string() ? p.at("max").get<std::string>() : number_text(p.at("max").get<double>());
        }
        if (p.contains("default")) {
          spec.has_default = true;
          if (spec.type == "choice") {
            spec.default_choice = p.at("default").get<std::string>();
          } else {
            spec.default_number = p.at("default").get<double>();
          }
        }
        t.specs.push_back(std::move(spec));
      }
    }
    for (const json& r : root.at("rules")) t.rules.emplace_back(r.at("id").get<std::string>(), r.at("message").get<std::string>());
    return t;
  }();
  return parsed;
}

template <typename Enum>
const char* choice_name(const char* param, Enum value) {
  return decoding_spec(param).choices.at(static_cast<size_t>(value)).c_str();
}

template <typename Enum>
bool parse_choice(const char* param, const std::string& name, Enum* out) {
  const int index = choice_index(decoding_spec(param), name);
  if (index < 0) return false;
  *out = static_cast<Enum>(index);
  return true;
}

}  // namespace

const std::vector<ParamSpec>& decoding_specs() { return table().specs; }

const ParamSpec& decoding_spec(const std::string& name) {
  for (const ParamSpec& spec : table().specs) {
    if (spec.name == name) return spec;
  }
  throw std::logic_error("engine/decoding-params.json has no parameter '" + name + "'");
}

std::string range_problem(const ParamSpec& spec, double value, int block_size) {
  double high = std::numeric_limits<double>::infinity();
  std::string bound = spec.max;
  if (spec.max == "block_size") {
    high = block_size;
    bound = "block_size (" + std::to_string(block_size) + ")";
  } else if (spec.max == "2^64-1") {
    high = 18446744073709551615.0;
  } else if (!spec.max.empty()) {
    high = std::stod(spec.max);
  }
  const bool above_low = spec.min_exclusive ? value > spec.min : value >= spec.min;
  if (std::isfinite(value) && above_low && value <= high) return "";
  if (spec.max.empty()) return ">= " + number_text(spec.min);
  return std::string("in ") + (spec.min_exclusive ? "(" : "[") + number_text(spec.min) + ", " + bound + "]";
}

int choice_index(const ParamSpec& spec, const std::string& value) {
  for (size_t i = 0; i < spec.choices.size(); ++i) {
    if (spec.choices[i] == value) return static_cast<int>(i);
  }
  return -1;
}

std::string choice_problem(const ParamSpec& spec, const std::string& value) {
  std::string names;
  for (size_t i = 0; i < spec.choices.size(); ++i) names += (i ? ", " : "") + spec.choices[i];
  std::string why;
  if (spec.name == "remasking" && (value == "verify" || value == "tree")) {
    why = " ('verify' and 'tree' kept a token only when a causal reading of the tokens before it chose it too: "
          "left-to-right decoding with a drafter, which a2d no longer does; decode by the denoiser's own confidence)";
  }
  return "one of " + names + why;
}

std::string broken_rule(const DecodeParams& p) {
  const bool one_by_one = p.min_per_step == 1 && (p.steps == 0 || p.steps >= p.block_size);
  if ((p.remasking == Remasking::leftmost || p.reveal_order == RevealOrder::prefix) && p.threshold >= 1.0 && one_by_one) {
    return "left_to_right";
  }
  if (p.advance == Advance::slide && p.steps > 0) return "schedule_needs_blocks";
  return "";
}

const std::string& rule_message(const std::string& id) {
  for (const auto& [rule, message] : table().rules) {
    if (rule == id) return message;
  }
  throw std::logic_error("engine/decoding-params.json has no rule '" + id + "'");
}

const char* remasking_name(Remasking remasking) { return choice_name("remasking", remasking); }
const char* advance_name(Advance advance) { return choice_name("advance", advance); }
const char* commit_name(CommitPolicy commit) { return choice_name("commit", commit); }
const char* reveal_order_name(RevealOrder order) { return choice_name("reveal_order", order); }
bool parse_remasking(const std::string& name, Remasking* out) { return parse_choice("remasking", name, out); }
bool parse_advance(const std::string& name, Advance* out) { return parse_choice("advance", name, out); }
bool parse_commit(const std::string& name, CommitPolicy* out) { return parse_choice("commit", name, out); }
bool parse_reveal_order(const std::string& name, RevealOrder* out) {
  return parse_choice("reveal_order", name, out);
}

void validate_decode_params(const DecodeParams& p, const ModelConfig& config) {
  auto bad = [](const std::string& what) { throw std::runtime_error("invalid decoding parameter: " + what); };
  const std::pair<const char*, double> values[] = {
      {"block_size", p.block_size}, {"threshold", p.threshold}, {"min_per_step", p.min_per_step},
      {"steps", p.steps},           {"temperature", p.temperature}, {"top_p", p.top_p},
      {"max_tokens", static_cast<double>(p.max_tokens)},
  };
  for (const auto& [name, value] : values) {
    const std::string problem = range_problem(decoding_spec(name), value, p.block_size);
    if (!problem.empty()) bad(std::string(name) + " is " + number_text(value) + ", it must be " + problem);
  }
  for (int32_t id : p.eos_token_ids) {
    if (id < 0 || id >= config.vocab_size) bad("eos_token_ids holds " + std::to_string(id) + ", outside the vocabulary");
  }
  const std::string rule = broken_rule(p);
  if (!rule.empty()) bad(rule + ": " + rule_message(rule));
}

}  // namespace a2d
