// Jinja templates rendered by jinja2 itself, in a CPython interpreter embedded in the process:
// chat templates render exactly as Hugging Face transformers renders them (apply_chat_template's
// sandboxed environment, filters and globals: model/template/jinja_env.py). Python and jinja2
// come from the system (Debian's libpython3.11 and python3-jinja2). The interpreter starts on
// the first Compile, isolated from the environment (no PYTHONPATH, no user site, no signal
// handlers) and lives as long as the process; every call holds the GIL for its duration.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace winnow::model::jinja {

// The prefix of the libpython the binary links (pkg-config's python3-embed), which the
// interpreter takes as its home whatever python3 comes first in PATH (a venv's included).
std::string_view PythonHome();

// What renders the templates, starting the interpreter if it has not started: {"python":
// version, "prefix": sys.prefix, "stdlib": the os module's directory, "jinja2": version,
// "jinja2_path": its package directory}. FailedPrecondition as Compile's.
absl::StatusOr<nlohmann::json> Interpreter();

class Template {
 public:
  // Compiles `source`. InvalidArgument with jinja2's message (syntax errors name the line);
  // FailedPrecondition when the interpreter or jinja2 cannot be loaded.
  static absl::StatusOr<Template> Compile(std::string_view source);

  // Renders with `variables` (a JSON object) as the template's variables. InvalidArgument with
  // the template's message (raise_exception's text as it is) when rendering fails.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& variables) const;

 private:
  struct Compiled;
  explicit Template(std::shared_ptr<const Compiled> compiled) : compiled_(std::move(compiled)) {}
  std::shared_ptr<const Compiled> compiled_;  // shared: copies of a template share one object
};

}  // namespace winnow::model::jinja
