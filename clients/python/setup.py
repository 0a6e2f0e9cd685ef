"""Builds winnow-client with its gRPC stubs generated from proto/ (grpcio-tools is a build
requirement in pyproject.toml), so the installed package never runs protoc."""

import pathlib
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from winnow_stubs import run_protoc  # noqa: E402


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        run_protoc(pathlib.Path(self.build_lib))


setup(cmdclass={"build_py": BuildPyWithStubs})
