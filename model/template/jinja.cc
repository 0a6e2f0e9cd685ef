#include "model/template/jinja.h"

// Python.h first, as the C API asks.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "absl/strings/str_cat.h"
#include "model/template/jinja_env_py.h"
#include "nlohmann/json.hpp"

namespace winnow::model::jinja {
namespace {

// Holds the GIL for a scope; any thread may take it.
class Gil {
 public:
  Gil() : state_(PyGILState_Ensure()) {}
  ~Gil() { PyGILState_Release(state_); }
  Gil(const Gil&) = delete;
  Gil& operator=(const Gil&) = delete;

 private:
  PyGILState_STATE state_;
};

// An owned reference, released when the scope ends (with the GIL held).
struct Ref {
  PyObject* p = nullptr;
  explicit Ref(PyObject* o) : p(o) {}
  ~Ref() { Py_XDECREF(p); }
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
};

std::string Utf8(PyObject* text) {
  Ref bytes(PyUnicode_AsEncodedString(text, "utf-8", "replace"));
  if (bytes.p == nullptr) {
    PyErr_Clear();
    return "(text not representable)";
  }
  return std::string(PyBytes_AS_STRING(bytes.p), PyBytes_GET_SIZE(bytes.p));
}

// The interpreter and jinja_env.py's functions, set up once per process.
struct Runtime {
  absl::Status status = absl::OkStatus();
  PyObject* compile = nullptr;
  PyObject* render = nullptr;
  PyObject* describe = nullptr;
  PyObject* interpreter = nullptr;
};

// The pending Python exception as text (jinja_env.describe's wording), clearing it.
std::string TakeError(const Runtime& rt) {
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  Ref t(type), v(value), tb(traceback);
  if (v.p == nullptr) return "unknown Python error";
  if (rt.describe != nullptr) {
    Ref text(PyObject_CallOneArg(rt.describe, v.p));
    if (text.p != nullptr && PyUnicode_Check(text.p)) return Utf8(text.p);
    PyErr_Clear();
  }
  Ref text(PyObject_Str(v.p));
  if (text.p == nullptr) {
    PyErr_Clear();
    return "unprintable Python error";
  }
  return Utf8(text.p);
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
constexpr bool kAddressSanitizer = __has_feature(address_sanitizer);
#else
constexpr bool kAddressSanitizer = false;
#endif

absl::Status StartInterpreter() {
  PyPreConfig preconfig;
  PyPreConfig_InitIsolatedConfig(&preconfig);
  // Python's small-object allocator keeps objects in arenas it maps itself, which LeakSanitizer
  // does not scan: under the sanitizers every object comes from malloc instead (renders take
  // about twice as long; elsewhere the default allocator stays).
  if (kAddressSanitizer) preconfig.allocator = PYMEM_ALLOCATOR_MALLOC;
  preconfig.utf8_mode = 1;
  PyStatus status = Py_PreInitialize(&preconfig);
  if (PyStatus_Exception(status)) {
    return absl::FailedPreconditionError(
        absl::StrCat("chat templates: Python did not start: ",
                     status.err_msg != nullptr ? status.err_msg : "unknown error"));
  }
  PyConfig config;
  PyConfig_InitIsolatedConfig(&config);
  config.install_signal_handlers = 0;  // the daemon owns SIGINT and SIGTERM
  config.write_bytecode = 0;
  config.site_import = 1;  // Debian's site module adds /usr/lib/python3/dist-packages
  // Both pinned (CMakeLists.txt says why): the program decides whether a pyvenv.cfg applies,
  // the home where the standard library is.
  status = PyConfig_SetBytesString(&config, &config.program_name, WINNOW_PYTHON_PROGRAM);
  if (!PyStatus_Exception(status)) {
    status = PyConfig_SetBytesString(&config, &config.home, WINNOW_PYTHON_HOME);
  }
  if (!PyStatus_Exception(status)) status = Py_InitializeFromConfig(&config);
  PyConfig_Clear(&config);
  if (PyStatus_Exception(status)) {
    return absl::FailedPreconditionError(
        absl::StrCat("chat templates: Python did not start: ",
                     status.err_msg != nullptr ? status.err_msg : "unknown error"));
  }
  return absl::OkStatus();
}

// Loads jinja_env.py as the module winnow_jinja_env; called with the GIL held.
absl::Status LoadEnvironment(Runtime* rt) {
  Ref code(Py_CompileString(kJinjaEnvPy, "model/template/jinja_env.py", Py_file_input));
  Ref module(code.p == nullptr ? nullptr
                               : PyImport_ExecCodeModule("winnow_jinja_env", code.p));
  if (module.p == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "chat templates need Python's jinja2 (Debian: python3-jinja2): ", TakeError(*rt)));
  }
  rt->compile = PyObject_GetAttrString(module.p, "compile_template");
  rt->render = PyObject_GetAttrString(module.p, "render");
  rt->describe = PyObject_GetAttrString(module.p, "describe");
  rt->interpreter = PyObject_GetAttrString(module.p, "interpreter");
  if (rt->compile == nullptr || rt->render == nullptr || rt->describe == nullptr ||
      rt->interpreter == nullptr) {
    return absl::InternalError(absl::StrCat("chat templates: ", TakeError(*rt)));
  }
  return absl::OkStatus();
}

const Runtime& GetRuntime() {
  static Runtime* runtime = [] {
    auto* rt = new Runtime;  // lives as long as the process, as the interpreter does
    if (Py_IsInitialized()) {
      rt->status = absl::FailedPreconditionError(
          "chat templates: a Python interpreter was started by someone else");
      return rt;
    }
    rt->status = StartInterpreter();
    if (!rt->status.ok()) return rt;
    rt->status = LoadEnvironment(rt);
    // Initialisation left this thread holding the GIL; every call takes it as it needs it.
    PyEval_SaveThread();
    return rt;
  }();
  return *runtime;
}

}  // namespace

std::string_view PythonHome() { return WINNOW_PYTHON_HOME; }

absl::StatusOr<nlohmann::json> Interpreter() {
  const Runtime& rt = GetRuntime();
  if (!rt.status.ok()) return rt.status;
  Gil gil;
  Ref text(PyObject_CallNoArgs(rt.interpreter));
  if (text.p == nullptr || !PyUnicode_Check(text.p)) {
    return absl::InternalError(absl::StrCat("chat templates: ", TakeError(rt)));
  }
  return nlohmann::json::parse(Utf8(text.p));
}

struct Template::Compiled {
  PyObject* object = nullptr;  // a jinja2 Template
  ~Compiled() {
    Gil gil;
    Py_XDECREF(object);
  }
};

absl::StatusOr<Template> Template::Compile(std::string_view source) {
  const Runtime& rt = GetRuntime();
  if (!rt.status.ok()) return rt.status;
  Gil gil;
  Ref text(PyUnicode_DecodeUTF8(source.data(), static_cast<Py_ssize_t>(source.size()),
                                "replace"));
  Ref compiled(text.p == nullptr ? nullptr : PyObject_CallOneArg(rt.compile, text.p));
  if (compiled.p == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("chat template: ", TakeError(rt)));
  }
  auto out = std::make_shared<Compiled>();
  std::swap(out->object, compiled.p);
  return Template(std::move(out));
}

absl::StatusOr<std::string> Template::Render(const nlohmann::ordered_json& variables) const {
  const Runtime& rt = GetRuntime();
  const std::string json_text = variables.dump(-1, ' ', /*ensure_ascii=*/false,
                                               nlohmann::ordered_json::error_handler_t::replace);
  Gil gil;
  Ref arg(PyUnicode_DecodeUTF8(json_text.data(), static_cast<Py_ssize_t>(json_text.size()),
                               "replace"));
  Ref rendered(arg.p == nullptr
                   ? nullptr
                   : PyObject_CallFunctionObjArgs(rt.render, compiled_->object, arg.p, nullptr));
  if (rendered.p == nullptr || !PyUnicode_Check(rendered.p)) {
    if (rendered.p != nullptr) return absl::InternalError("chat template: render gave no text");
    return absl::InvalidArgumentError(absl::StrCat("chat template: ", TakeError(rt)));
  }
  return Utf8(rendered.p);
}

}  // namespace winnow::model::jinja
