#include "structured/grammar.h"

#include <algorithm>
#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace winnow::structured {

// ordered_json keeps the schema's property order, which is the order properties are generated in.
using Json = nlohmann::ordered_json;

bool NumberBounds::Contains(double v) const {
  if (min && (min_exclusive ? v <= *min : v < *min)) return false;
  if (max && (max_exclusive ? v >= *max : v > *max)) return false;
  return true;
}

int32_t Node::FirstRequiredFrom(int32_t from) const {
  const int32_t n = static_cast<int32_t>(properties.size());
  for (int32_t i = from; i < n; ++i) {
    if (properties[i].required) return i;
  }
  return n;
}

namespace {

constexpr int kMaxSchemaDepth = 64;
constexpr int32_t kMaxNodes = 20000;
constexpr size_t kMaxLiterals = 4096;

// Keywords that only annotate: accepted and ignored, as validators ignore them ("format" is
// an annotation by default in JSON Schema 2019-09 and later; it is not enforced).
const absl::flat_hash_set<std::string_view>& Annotations() {
  static const auto* set = new absl::flat_hash_set<std::string_view>{
      "title", "description", "default", "examples", "$schema", "$id", "$comment",
      "deprecated", "readOnly", "writeOnly", "format", "$defs", "definitions"};
  return *set;
}

const absl::flat_hash_set<std::string_view>& Supported() {
  static const auto* set = new absl::flat_hash_set<std::string_view>{
      "type", "properties", "required", "additionalProperties", "items", "minItems",
      "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "minLength",
      "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
  return *set;
}

std::string Where(const std::string& path) { return path.empty() ? "the schema" : path; }

absl::Status Bad(const std::string& path, std::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(Where(path), ": ", std::string(why)));
}

std::string Join(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : absl::StrCat(path, ".", std::string(key));
}

bool MatchesType(const Json& value, std::string_view type) {
  if (type == "string") return value.is_string();
  if (type == "integer") {
    return value.is_number_integer() ||
           (value.is_number_float() && std::floor(value.get<double>()) == value.get<double>());
  }
  if (type == "number") return value.is_number();
  if (type == "boolean") return value.is_boolean();
  if (type == "null") return value.is_null();
  if (type == "object") return value.is_object();
  if (type == "array") return value.is_array();
  return false;
}

}  // namespace

// Compiles one schema document into a Grammar's nodes. $refs are memoised by their pointer, so
// a recursive schema becomes a cycle in the node graph (the matcher bounds the nesting depth).
class SchemaCompiler {
 public:
  explicit SchemaCompiler(const Json& root) : root_(&root) {}

  absl::StatusOr<std::shared_ptr<const Grammar>> Run() {
    auto grammar = std::make_shared<Grammar>();
    grammar_ = grammar.get();
    WINNOW_ASSIGN_OR_RETURN(grammar->root_, Compile(*root_, "", 0));
    return grammar;
  }

  // Tool calls: open + one of {"name": <tool>, "arguments": <its parameters>} + close, repeated
  // with separators when parallel. Each tool's parameters are a document of their own (their
  // $refs resolve inside them).
  absl::StatusOr<std::shared_ptr<const Grammar>> ToolCalls(const std::vector<ToolSpec>& tools,
                                                           bool parallel,
                                                           const ToolCallFormat& format) {
    auto grammar = std::make_shared<Grammar>();
    grammar_ = grammar.get();
    Node call;  // kAnyOf over the tools
    for (size_t i = 0; i < tools.size(); ++i) {
      const std::string path = absl::StrCat("tools[", i, "].parameters");
      Json params = tools[i].parameters.empty()
                        ? Json{{"type", "object"}, {"additionalProperties", false}}
                        : Json::parse(tools[i].parameters, nullptr, false);
      if (params.is_discarded()) return Bad(path, "not valid JSON");
      root_ = &params;
      ref_scope_ = absl::StrCat(i, ":");
      WINNOW_ASSIGN_OR_RETURN(const int32_t arguments, Compile(params, path, 0));
      Node object;
      object.kind = NodeKind::kObject;
      object.properties = {{"name", Add(Literals({Json(tools[i].name).dump()})), true},
                           {format.arguments_key, arguments, true}};
      object.key_trie.Insert("\"name\"", 0);
      object.key_trie.Insert(Json(format.arguments_key).dump(), 1);
      call.alternatives.push_back(Add(std::move(object)));
    }
    Node one;
    one.kind = NodeKind::kSequence;
    if (!format.open.empty()) one.sequence.push_back(Add(Literals({format.open})));
    one.sequence.push_back(Add(std::move(call)));
    if (!format.close.empty()) one.sequence.push_back(Add(Literals({format.close})));
    const int32_t one_call = Add(std::move(one));
    if (!parallel) {
      grammar->root_ = one_call;
      return grammar;
    }
    // calls = one_call (separator calls)?: the optional tail is an anyOf with an empty
    // sequence; the recursion is in tail position, so the stack does not grow per call.
    const int32_t calls = Add(Node{.kind = NodeKind::kSequence});
    const int32_t more = Add(Node{.kind = NodeKind::kSequence});
    const int32_t none = Add(Node{.kind = NodeKind::kSequence});
    const int32_t tail = Add(Node{});
    grammar->nodes_[more].sequence = {Add(Literals({format.separator})), calls};
    grammar->nodes_[tail].alternatives = {more, none};
    grammar->nodes_[calls].sequence = {one_call, tail};
    grammar->root_ = calls;
    return grammar;
  }

  // The root is any JSON object: {"type": "object"} with nothing declared.
  std::shared_ptr<const Grammar> AnyObject() {
    auto grammar = std::make_shared<Grammar>();
    grammar_ = grammar.get();
    Node object;
    object.kind = NodeKind::kObject;
    object.additional = AnyValue();
    grammar->root_ = Add(std::move(object));
    return grammar;
  }

 private:
  int32_t Add(Node node) {
    grammar_->nodes_.push_back(std::move(node));
    return static_cast<int32_t>(grammar_->nodes_.size()) - 1;
  }

  absl::StatusOr<int32_t> AddChecked(Node node, const std::string& path) {
    if (grammar_->num_nodes() >= kMaxNodes) {
      return Bad(path, absl::StrCat("the schema is too large (over ", kMaxNodes, " nodes)"));
    }
    return Add(std::move(node));
  }

  static Node Literals(const std::vector<std::string>& texts) {
    Node node;
    node.kind = NodeKind::kLiterals;
    for (size_t i = 0; i < texts.size(); ++i) {
      node.literals.Insert(texts[i], static_cast<int32_t>(i));
    }
    return node;
  }

  // Any JSON value: one shared node per grammar, built on first use.
  int32_t AnyValue() {
    if (any_value_ >= 0) return any_value_;
    any_value_ = Add(Node{});  // kAnyOf, alternatives filled below (the graph is cyclic)
    Node object;
    object.kind = NodeKind::kObject;
    object.additional = any_value_;
    Node array;
    array.kind = NodeKind::kArray;
    array.items = any_value_;
    Node string;
    string.kind = NodeKind::kString;
    Node number;
    number.kind = NodeKind::kNumber;
    std::vector<int32_t> alternatives = {Add(std::move(object)), Add(std::move(array)),
                                         Add(std::move(string)), Add(std::move(number)),
                                         Add(Literals({"true", "false", "null"}))};
    grammar_->nodes_[any_value_].alternatives = std::move(alternatives);
    return any_value_;
  }

  absl::StatusOr<int32_t> Compile(const Json& schema, const std::string& path, int depth) {
    if (depth > kMaxSchemaDepth) {
      return Bad(path, absl::StrCat("nested deeper than ", kMaxSchemaDepth, " levels"));
    }
    if (schema.is_boolean()) {
      if (schema.get<bool>()) return AnyValue();
      return Bad(path, "the schema `false` accepts nothing");
    }
    if (!schema.is_object()) return Bad(path, "a schema must be an object or a boolean");
    WINNOW_RETURN_IF_ERROR(CheckKeywords(schema, path));
    if (const auto ref = schema.find("$ref"); ref != schema.end()) {
      WINNOW_RETURN_IF_ERROR(OnlyAnnotationsBeside(schema, "$ref", path));
      return CompileRef(*ref, Join(path, "$ref"), depth);
    }
    for (const char* combinator : {"anyOf", "oneOf", "allOf"}) {
      if (const auto it = schema.find(combinator); it != schema.end()) {
        WINNOW_RETURN_IF_ERROR(OnlyAnnotationsBeside(schema, combinator, path));
        return CompileCombinator(*it, combinator, Join(path, combinator), depth);
      }
    }
    if (schema.contains("enum") || schema.contains("const")) return CompileLiterals(schema, path);
    WINNOW_ASSIGN_OR_RETURN(const std::vector<std::string> types, Types(schema, path));
    if (types.empty()) return AnyValue();
    if (types.size() == 1) return CompileTyped(schema, types[0], path, depth);
    Node any_of;
    for (const std::string& type : types) {
      WINNOW_ASSIGN_OR_RETURN(const int32_t alt, CompileTyped(schema, type, path, depth));
      any_of.alternatives.push_back(alt);
    }
    return AddChecked(std::move(any_of), path);
  }

  static absl::Status CheckKeywords(const Json& schema, const std::string& path) {
    for (const auto& [key, value] : schema.items()) {
      if (Supported().contains(key) || Annotations().contains(key)) continue;
      return Bad(Join(path, key), absl::StrCat("the keyword \"", key,
                                               "\" is not supported in structured output"));
    }
    return absl::OkStatus();
  }

  static absl::Status OnlyAnnotationsBeside(const Json& schema, std::string_view keyword,
                                            const std::string& path) {
    for (const auto& [key, value] : schema.items()) {
      if (key == keyword || Annotations().contains(key)) continue;
      return Bad(Join(path, key), absl::StrCat("\"", key, "\" beside \"", std::string(keyword),
                                               "\" is not supported"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<int32_t> CompileRef(const Json& ref, const std::string& path, int depth) {
    if (!ref.is_string()) return Bad(path, "must be a string");
    const std::string pointer = ref.get<std::string>();
    if (const auto it = refs_.find(ref_scope_ + pointer); it != refs_.end()) return it->second;
    if (pointer.empty() || pointer[0] != '#') {
      return Bad(path, absl::StrCat("only references inside the schema (\"#/...\") are "
                                    "supported, not \"", pointer, "\""));
    }
    const Json* target = nullptr;
    try {
      target = &root_->at(Json::json_pointer(pointer.substr(1)));
    } catch (const Json::exception&) {
      return Bad(path, absl::StrCat("\"", pointer, "\" does not resolve"));
    }
    // Reserve the node first: a reference back to this one (recursion) gets its id.
    WINNOW_ASSIGN_OR_RETURN(const int32_t id, AddChecked(Node{}, path));
    refs_[ref_scope_ + pointer] = id;
    WINNOW_ASSIGN_OR_RETURN(const int32_t body, Compile(*target, pointer, depth + 1));
    // The reserved node forwards to the body: an anyOf of one.
    grammar_->nodes_[id].alternatives = {body};
    return id;
  }

  absl::StatusOr<int32_t> CompileCombinator(const Json& list, std::string_view keyword,
                                            const std::string& path, int depth) {
    if (!list.is_array() || list.empty()) return Bad(path, "must be a non-empty array");
    if (keyword == "allOf") {
      if (list.size() != 1) return Bad(path, "allOf with more than one schema is not supported");
      return Compile(list[0], Join(path, "0"), depth + 1);
    }
    // oneOf is compiled as anyOf: the output matches at least one alternative; exclusivity is
    // not enforced (documented).
    Node any_of;
    for (size_t i = 0; i < list.size(); ++i) {
      WINNOW_ASSIGN_OR_RETURN(const int32_t alt,
                              Compile(list[i], Join(path, std::to_string(i)), depth + 1));
      any_of.alternatives.push_back(alt);
    }
    return AddChecked(std::move(any_of), path);
  }

  absl::StatusOr<std::vector<std::string>> Types(const Json& schema, const std::string& path) {
    static const absl::flat_hash_set<std::string_view> kTypes = {
        "string", "number", "integer", "boolean", "null", "object", "array"};
    std::vector<std::string> types;
    const auto it = schema.find("type");
    if (it == schema.end()) {
      // No type: infer it from the keywords, as generators of structured output do.
      if (schema.contains("properties") || schema.contains("required") ||
          schema.contains("additionalProperties")) {
        types.push_back("object");
      } else if (schema.contains("items") || schema.contains("minItems") ||
                 schema.contains("maxItems")) {
        types.push_back("array");
      } else if (schema.contains("minLength") || schema.contains("maxLength")) {
        types.push_back("string");
      } else if (schema.contains("minimum") || schema.contains("maximum") ||
                 schema.contains("exclusiveMinimum") || schema.contains("exclusiveMaximum")) {
        types.push_back("number");
      }
      return types;
    }
    const std::string type_path = Join(path, "type");
    const Json list = it->is_array() ? *it : Json::array({*it});
    if (list.empty()) return Bad(type_path, "must not be empty");
    for (const Json& t : list) {
      if (!t.is_string() || !kTypes.contains(t.get<std::string>())) {
        return Bad(type_path, absl::StrCat("unknown type ", t.dump()));
      }
      types.push_back(t.get<std::string>());
    }
    return types;
  }

  absl::StatusOr<int32_t> CompileLiterals(const Json& schema, const std::string& path) {
    std::vector<Json> values;
    if (const auto c = schema.find("const"); c != schema.end()) values.push_back(*c);
    if (const auto e = schema.find("enum"); e != schema.end()) {
      if (!e->is_array() || e->empty()) return Bad(Join(path, "enum"), "must be a non-empty array");
      if (!values.empty()) return Bad(path, "\"enum\" beside \"const\" is not supported");
      values.assign(e->begin(), e->end());
    }
    if (values.size() > kMaxLiterals) {
      return Bad(Join(path, "enum"), absl::StrCat("more than ", kMaxLiterals, " values"));
    }
    WINNOW_ASSIGN_OR_RETURN(const std::vector<std::string> types, Types(schema, path));
    std::vector<std::string> texts;
    for (const Json& v : values) {
      const bool typed = types.empty() || std::any_of(types.begin(), types.end(), [&](auto& t) {
                           return MatchesType(v, t);
                         });
      if (typed) texts.push_back(v.dump());
    }
    if (texts.empty()) return Bad(path, "no value of \"enum\"/\"const\" has the declared type");
    return AddChecked(Literals(texts), path);
  }

  absl::StatusOr<int32_t> CompileTyped(const Json& schema, const std::string& type,
                                       const std::string& path, int depth) {
    if (type == "object") return CompileObject(schema, path, depth);
    if (type == "array") return CompileArray(schema, path, depth);
    if (type == "string") return CompileString(schema, path);
    if (type == "number" || type == "integer") return CompileNumber(schema, type, path);
    if (type == "boolean") return AddChecked(Literals({"true", "false"}), path);
    return AddChecked(Literals({"null"}), path);
  }

  absl::StatusOr<int32_t> CompileObject(const Json& schema, const std::string& path, int depth) {
    Node object;
    object.kind = NodeKind::kObject;
    absl::flat_hash_set<std::string> required;
    if (const auto r = schema.find("required"); r != schema.end()) {
      if (!r->is_array()) return Bad(Join(path, "required"), "must be an array of names");
      for (const Json& name : *r) {
        if (!name.is_string()) return Bad(Join(path, "required"), "must be an array of names");
        required.insert(name.get<std::string>());
      }
    }
    const auto props = schema.find("properties");
    if (props != schema.end()) {
      if (!props->is_object()) return Bad(Join(path, "properties"), "must be an object");
      for (const auto& [name, sub] : props->items()) {
        WINNOW_ASSIGN_OR_RETURN(
            const int32_t value,
            Compile(sub, Join(Join(path, "properties"), name), depth + 1));
        object.properties.push_back({name, value, required.contains(name)});
        required.erase(name);
      }
    }
    if (!required.empty()) {
      return Bad(Join(path, "required"),
                 absl::StrCat("names \"", *required.begin(), "\", which \"properties\" does not "
                              "declare"));
    }
    // Undeclared keys: as "additionalProperties" says; when it is absent, none where properties
    // are declared (as OpenAI's strict mode requires) and any where none are.
    const auto extra = schema.find("additionalProperties");
    if (extra != schema.end()) {
      if (!(extra->is_boolean() && !extra->get<bool>())) {
        WINNOW_ASSIGN_OR_RETURN(object.additional,
                                Compile(*extra, Join(path, "additionalProperties"), depth + 1));
      }
    } else if (object.properties.empty()) {
      object.additional = AnyValue();
    }
    for (size_t i = 0; i < object.properties.size(); ++i) {
      object.key_trie.Insert(Json(object.properties[i].name).dump(), static_cast<int32_t>(i));
    }
    return AddChecked(std::move(object), path);
  }

  absl::StatusOr<int32_t> CompileArray(const Json& schema, const std::string& path, int depth) {
    Node array;
    array.kind = NodeKind::kArray;
    if (const auto items = schema.find("items"); items != schema.end()) {
      if (items->is_array()) return Bad(Join(path, "items"), "tuple \"items\" is not supported");
      WINNOW_ASSIGN_OR_RETURN(array.items, Compile(*items, Join(path, "items"), depth + 1));
    } else {
      array.items = AnyValue();
    }
    WINNOW_ASSIGN_OR_RETURN(array.min_items, Count(schema, "minItems", path, 0));
    WINNOW_ASSIGN_OR_RETURN(array.max_items, Count(schema, "maxItems", path, -1));
    if (array.max_items >= 0 && array.min_items > array.max_items) {
      return Bad(Join(path, "minItems"), "is greater than maxItems");
    }
    return AddChecked(std::move(array), path);
  }

  absl::StatusOr<int32_t> CompileString(const Json& schema, const std::string& path) {
    Node string;
    string.kind = NodeKind::kString;
    WINNOW_ASSIGN_OR_RETURN(string.min_length, Count(schema, "minLength", path, 0));
    WINNOW_ASSIGN_OR_RETURN(string.max_length, Count(schema, "maxLength", path, -1));
    if (string.max_length >= 0 && string.min_length > string.max_length) {
      return Bad(Join(path, "minLength"), "is greater than maxLength");
    }
    return AddChecked(std::move(string), path);
  }

  static absl::StatusOr<int32_t> Count(const Json& schema, const char* key,
                                       const std::string& path, int32_t absent) {
    const auto it = schema.find(key);
    if (it == schema.end()) return absent;
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > (1 << 20)) {
      return Bad(Join(path, key), "must be an integer in [0, 1048576]");
    }
    return static_cast<int32_t>(it->get<int64_t>());
  }

  absl::StatusOr<int32_t> CompileNumber(const Json& schema, const std::string& type,
                                        const std::string& path) {
    Node number;
    number.kind = type == "integer" ? NodeKind::kInteger : NodeKind::kNumber;
    NumberBounds& b = number.bounds;
    auto read = [&](const char* key) -> absl::StatusOr<std::optional<double>> {
      const auto it = schema.find(key);
      if (it == schema.end() || it->is_boolean()) return std::nullopt;
      if (!it->is_number() || !std::isfinite(it->get<double>())) {
        return Bad(Join(path, key), "must be a finite number");
      }
      return it->get<double>();
    };
    WINNOW_ASSIGN_OR_RETURN(b.min, read("minimum"));
    WINNOW_ASSIGN_OR_RETURN(b.max, read("maximum"));
    WINNOW_ASSIGN_OR_RETURN(const std::optional<double> xmin, read("exclusiveMinimum"));
    WINNOW_ASSIGN_OR_RETURN(const std::optional<double> xmax, read("exclusiveMaximum"));
    if (xmin && (!b.min || *xmin >= *b.min)) b.min = xmin, b.min_exclusive = true;
    if (xmax && (!b.max || *xmax <= *b.max)) b.max = xmax, b.max_exclusive = true;
    // Draft 4's boolean form: exclusiveMinimum: true makes minimum exclusive.
    auto flag = [&](const char* key) {
      const auto it = schema.find(key);
      return it != schema.end() && it->is_boolean() && it->get<bool>();
    };
    if (flag("exclusiveMinimum") && b.min) b.min_exclusive = true;
    if (flag("exclusiveMaximum") && b.max) b.max_exclusive = true;
    if (number.kind == NodeKind::kInteger) {
      // Integer bounds as inclusive integers.
      if (b.min) b.min = b.min_exclusive ? std::floor(*b.min) + 1 : std::ceil(*b.min);
      if (b.max) b.max = b.max_exclusive ? std::ceil(*b.max) - 1 : std::floor(*b.max);
      b.min_exclusive = b.max_exclusive = false;
    }
    if (b.min && b.max && (*b.min > *b.max || (*b.min == *b.max &&
                                               (b.min_exclusive || b.max_exclusive)))) {
      return Bad(Join(path, "minimum"), "no number lies between the bounds");
    }
    return AddChecked(std::move(number), path);
  }

  const Json* root_;  // what "#/..." references resolve against
  std::string ref_scope_;  // keeps the $refs of different roots apart
  Grammar* grammar_ = nullptr;
  int32_t any_value_ = -1;
  absl::flat_hash_map<std::string, int32_t> refs_;
};

std::shared_ptr<const Grammar> Grammar::AnyObject() {
  static const Json kEmpty = Json::object();
  return SchemaCompiler(kEmpty).AnyObject();
}

absl::StatusOr<std::shared_ptr<const Grammar>> Grammar::ForToolCalls(
    const std::vector<ToolSpec>& tools, bool parallel, const ToolCallFormat& format) {
  if (tools.empty()) return absl::InvalidArgumentError("tools: no tool to call");
  static const Json kEmpty = Json::object();
  return SchemaCompiler(kEmpty).ToolCalls(tools, parallel, format);
}

absl::StatusOr<std::shared_ptr<const Grammar>> Grammar::FromJsonSchema(
    std::string_view schema_json) {
  Json schema = Json::parse(schema_json, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) return absl::InvalidArgumentError("the schema is not valid JSON");
  return SchemaCompiler(schema).Run();
}

}  // namespace winnow::structured
