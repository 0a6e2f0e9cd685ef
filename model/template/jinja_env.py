"""Chat templates rendered as Hugging Face transformers renders them in apply_chat_template.

winnow's daemon runs this module inside its embedded interpreter (model/template/jinja.cc). The
environment is transformers' (transformers/utils/chat_template_utils.py): jinja2's
ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the loop-control extension,
the {% generation %} tag (rendered as its body), and the globals and filters transformers adds:
tojson (json.dumps, non-ASCII kept), raise_exception, strftime_now, dict and namespace.
"""
import datetime
import json
import os
import sys

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox
import jinja2.utils


class _GenerationTag(jinja2.ext.Extension):
    # Marks the assistant's tokens for training masks; rendering only needs its body.
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Jinja's own tojson escapes HTML characters; transformers' does not.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(format):
    return datetime.datetime.now().strftime(format)


class _TemplateDict:
    # dict() without the dict type itself, so a template cannot reach its attributes.
    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    # A namespace that refuses underscore-prefixed names (no route to CPython internals).
    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes on a namespace, "
                f"but got {name!r}")


def _environment():
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


_ENV = _environment()


def compile_template(source):
    return _ENV.from_string(source)


def render(template, variables_json):
    """Renders with the variables of a JSON object (messages, tools, add_generation_prompt,
    the special tokens, ...), as apply_chat_template passes them."""
    return template.render(**json.loads(variables_json))


def describe(error):
    """The message a client sees for a template's error: raise_exception's text as it is,
    anything else prefixed with its type (and the template's line where jinja2 knows it)."""
    if isinstance(error, jinja2.exceptions.TemplateSyntaxError):
        return f"syntax error at line {error.lineno}: {error.message}"
    if type(error) is jinja2.exceptions.TemplateError:
        return str(error)
    return f"{type(error).__name__}: {error}"


def interpreter():
    """What renders the templates, as JSON (jinja.h's Interpreter)."""
    return json.dumps({
        "python": sys.version.split()[0], "prefix": sys.prefix,
        "stdlib": os.path.dirname(os.__file__), "jinja2": jinja2.__version__,
        "jinja2_path": os.path.dirname(jinja2.__file__)})
