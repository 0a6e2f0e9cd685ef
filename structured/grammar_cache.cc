#include "structured/grammar_cache.h"

#include <list>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace winnow::structured {
namespace {

class GrammarCache {
 public:
  std::shared_ptr<const CompiledGrammar> Find(std::string_view schema) {
    absl::MutexLock lock(&mu_);
    const auto it = index_.find(schema);
    if (it == index_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return it->second->second;
  }

  void Insert(std::string_view schema, std::shared_ptr<const CompiledGrammar> grammar) {
    absl::MutexLock lock(&mu_);
    if (index_.contains(schema)) return;
    order_.emplace_front(std::string(schema), std::move(grammar));
    index_.emplace(order_.front().first, order_.begin());
    if (order_.size() > kCachedGrammars) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
  }

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const CompiledGrammar>>;
  absl::Mutex mu_;
  std::list<Entry> order_ ABSL_GUARDED_BY(mu_);  // most recently used first
  absl::flat_hash_map<std::string_view, std::list<Entry>::iterator> index_ ABSL_GUARDED_BY(mu_);
};

GrammarCache& Cache() {
  static auto* cache = new GrammarCache();
  return *cache;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileJsonSchema(std::string_view schema) {
  if (auto cached = Cache().Find(schema); cached != nullptr) return cached;
  absl::StatusOr<std::shared_ptr<const Grammar>> grammar = Grammar::FromJsonSchema(schema);
  if (!grammar.ok()) return grammar.status();
  auto compiled = std::make_shared<const CompiledGrammar>(*std::move(grammar));
  Cache().Insert(schema, compiled);
  return compiled;
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileToolCalls(
    const std::vector<ToolSpec>& tools, bool parallel, const ToolCallFormat& format) {
  // The key: everything the grammar depends on, unambiguously (lengths before texts).
  std::string key = parallel ? "tools+parallel:" : "tools:";
  for (const std::string* part : {&format.open, &format.close, &format.separator,
                                  &format.arguments_key}) {
    absl::StrAppend(&key, part->size(), ":", *part);
  }
  for (const ToolSpec& t : tools) {
    absl::StrAppend(&key, t.name.size(), ":", t.name, t.parameters.size(), ":", t.parameters);
  }
  if (auto cached = Cache().Find(key); cached != nullptr) return cached;
  absl::StatusOr<std::shared_ptr<const Grammar>> grammar =
      Grammar::ForToolCalls(tools, parallel, format);
  if (!grammar.ok()) return grammar.status();
  auto compiled = std::make_shared<const CompiledGrammar>(*std::move(grammar));
  Cache().Insert(key, compiled);
  return compiled;
}

std::shared_ptr<const CompiledGrammar> JsonObjectGrammar() {
  static const auto* grammar = new std::shared_ptr<const CompiledGrammar>(
      std::make_shared<const CompiledGrammar>(Grammar::AnyObject()));
  return *grammar;
}

}  // namespace winnow::structured
