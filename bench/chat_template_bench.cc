// What rendering a chat template costs: a 20-message chat (system, then user and assistant
// turns of about 40 words) with two tools, rendered through each --templates file (default: the
// model's own template) by the embedded jinja2, as the daemon renders a request. Prints the
// first compile's time (the interpreter's start included), a compile's, and the median and p99
// render over --reps renders; never asserts on time.
//
//   chat_template_bench --model=PATH [--templates=A.jinja,B.jinja] [--reps=500]

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/cli.h"
#include "bench/bench_util.h"
#include "model/chat_template.h"
#include "model/gguf.h"

namespace winnow {
namespace {

struct Options {
  std::string model;
  std::vector<std::string> templates;
  int reps = 500;
};

constexpr char kWeather[] =
    R"({"type": "function", "function": {"name": "get_weather", "description": "Weather",)"
    R"( "parameters": {"type": "object", "properties": {"city": {"type": "string"},)"
    R"( "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}})";
constexpr char kNow[] =
    R"({"type": "function", "function": {"name": "now", "description": "The time",)"
    R"( "parameters": {"type": "object", "properties": {}}}})";

std::vector<model::ChatMessage> TwentyMessages() {
  std::vector<model::ChatMessage> chat;
  model::ChatMessage system;
  system.role = "system";
  system.content = "Be brief.";
  chat.push_back(system);
  for (int i = 0; i < 19; ++i) {
    model::ChatMessage m;
    m.role = i % 2 == 0 ? "user" : "assistant";
    m.content = absl::StrCat("Message ", i, ":");
    for (int w = 0; w < 40; ++w) m.content += " words";
    chat.push_back(std::move(m));
  }
  return chat;
}

// Milliseconds of `fn`, once.
template <typename Fn>
double TimeMs(Fn&& fn) {
  const double t0 = bench::Now(false);
  fn();
  return (bench::Now(false) - t0) * 1e3;
}

int Bench(const std::string& name, const model::GgufFile& file, const std::string& path,
          int reps, bool first) {
  absl::StatusOr<model::ChatTemplate> tmpl = absl::UnknownError("");
  const double compile_ms = TimeMs([&] { tmpl = model::ChatTemplate::FromGguf(file, path); });
  if (!tmpl.ok()) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), std::string(tmpl.status().message()).c_str());
    return 1;
  }
  const std::vector<model::ChatMessage> chat = TwentyMessages();
  const std::vector<std::string> tools = {kWeather, kNow};
  const absl::StatusOr<std::string> once = tmpl->Apply(chat, true, tools);
  if (!once.ok()) {  // e.g. a template that refuses system turns
    std::printf("%-44s %12.2f  refuses the chat: %s\n", name.c_str(), compile_ms,
                std::string(once.status().message()).c_str());
    return 0;
  }
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) ms.push_back(TimeMs([&] { (void)tmpl->Apply(chat, true, tools); }));
  std::sort(ms.begin(), ms.end());
  std::printf("%-44s %12.2f %12.3f %12.3f %10zu%s\n", name.c_str(), compile_ms, ms[ms.size() / 2],
              ms[ms.size() * 99 / 100], once->size(), first ? "  (compile: interpreter start)" : "");
  return 0;
}

int Run(const Options& opt) {
  auto file = model::GgufFile::Open(opt.model);
  if (!file.ok()) {
    std::fprintf(stderr, "%s\n", std::string(file.status().message()).c_str());
    return 1;
  }
  std::printf("%-44s %12s %12s %12s %10s\n", "template", "compile ms", "render p50", "render p99",
              "bytes");
  std::vector<std::string> paths = opt.templates;
  if (paths.empty()) paths.push_back("");  // the model's own
  bool first = true;
  for (const std::string& path : paths) {
    const std::string name = path.empty() ? "(the model's)" : path.substr(path.rfind('/') + 1);
    if (Bench(name, **file, path, opt.reps, first) != 0) return 1;
    first = false;
  }
  return 0;
}

std::optional<int> ParseOptions(int argc, char** argv, Options* opt) {
  CLI::App app("Chat template rendering cost (embedded jinja2).", "chat_template_bench");
  base::ConfigureApp(app);
  app.add_option("--model", opt->model, "GGUF model (its template and special tokens)")
      ->required();
  app.add_option("--templates", opt->templates, "Jinja files, comma-separated")->delimiter(',');
  app.add_option("--reps", opt->reps, "renders timed per template")->check(base::AtLeast(1));
  return base::ParseCommandLine(app, argc, argv);
}

}  // namespace
}  // namespace winnow

int main(int argc, char** argv) {
  winnow::Options opt;
  if (std::optional<int> exit = winnow::ParseOptions(argc, argv, &opt)) return *exit;
  return winnow::Run(opt);
}
