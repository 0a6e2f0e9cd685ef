// A JSON grammar compiled from a JSON Schema (or "any JSON object", for OpenAI's json_object
// mode): a graph of nodes that json_matcher.h walks byte by byte. Compiling is where a schema
// is validated: a keyword the grammar cannot enforce is an InvalidArgument naming its path,
// never a silently looser output. docs/api.md, "Structured output", lists what is supported.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "structured/byte_trie.h"

namespace winnow::structured {

enum class NodeKind : uint8_t {
  kObject,
  kArray,
  kString,
  kNumber,
  kInteger,
  kLiterals,  // one of a set of texts (enum, const, true/false, null; or raw text), byte for byte
  kAnyOf,     // any of `alternatives`
  kSequence,  // `sequence` in order, with nothing between (tool-call framing)
};

// Bounds of a number or integer node; absent ends are unbounded.
struct NumberBounds {
  std::optional<double> min;
  std::optional<double> max;
  bool min_exclusive = false;
  bool max_exclusive = false;

  bool bounded() const { return min.has_value() || max.has_value(); }
  bool Contains(double v) const;
};

// A function the model may call: its parameters are a JSON Schema (text; empty: none).
struct ToolSpec {
  std::string name;
  std::string parameters;
};

// How tool calls are written: open + {"name": ..., "<arguments_key>": {...}} + close, several
// separated by `separator` when parallel calls are allowed (Hermes / Qwen2.5's format by default).
struct ToolCallFormat {
  std::string open = "<tool_call>\n";
  std::string close = "\n</tool_call>";
  std::string separator = "\n";
  std::string arguments_key = "arguments";

  // Llama 3.1-3.3's JSON tool calls: the reply is {"name": ..., "parameters": {...}} alone.
  static ToolCallFormat LlamaJson() { return {"", "", "", "parameters"}; }
};

struct Property {
  std::string name;
  int32_t value = -1;  // node
  bool required = false;
};

struct Node {
  NodeKind kind = NodeKind::kAnyOf;
  // kObject: declared properties, generated in this order (any optional one may be skipped),
  // their keys as JSON strings in key_trie (a terminal is the property's index); `additional`
  // is the value node of undeclared keys (-1: none allowed).
  std::vector<Property> properties;
  ByteTrie key_trie;
  int32_t additional = -1;
  // kArray.
  int32_t items = -1;
  int32_t min_items = 0;
  int32_t max_items = -1;  // -1: unbounded
  // kString: length in code points.
  int32_t min_length = 0;
  int32_t max_length = -1;
  // kNumber / kInteger.
  NumberBounds bounds;
  // kLiterals: the JSON texts; a terminal marks a complete one.
  ByteTrie literals;
  // kAnyOf.
  std::vector<int32_t> alternatives;
  // kSequence.
  std::vector<int32_t> sequence;

  // Index of the first required property at or after `from` (properties.size() if none).
  int32_t FirstRequiredFrom(int32_t from) const;
};

class Grammar {
 public:
  // Any JSON object (OpenAI's {"type": "json_object"}).
  static std::shared_ptr<const Grammar> AnyObject();
  // The grammar of `schema_json`, a JSON Schema document. Errors are InvalidArgument and name
  // the schema path ("properties.age.minimum") and the keyword.
  static absl::StatusOr<std::shared_ptr<const Grammar>> FromJsonSchema(
      std::string_view schema_json);
  // One call (or, when `parallel`, one or more) of one of `tools`, in `format`: the arguments
  // follow the tool's parameters schema. Errors name the tool ("tools[1].parameters: ...").
  static absl::StatusOr<std::shared_ptr<const Grammar>> ForToolCalls(
      const std::vector<ToolSpec>& tools, bool parallel, const ToolCallFormat& format);

  const Node& node(int32_t id) const { return nodes_[id]; }
  int32_t root() const { return root_; }
  int32_t num_nodes() const { return static_cast<int32_t>(nodes_.size()); }

 private:
  friend class SchemaCompiler;
  std::vector<Node> nodes_;
  int32_t root_ = -1;
};

}  // namespace winnow::structured
