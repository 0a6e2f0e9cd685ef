# Writes a header defining `inline constexpr char ${NAME}[]` with the text of ${INPUT}, as a raw
# string literal, so text files (a Python module, a Jinja template) ship inside the binary.
# Run as: cmake -DINPUT=file -DOUTPUT=header.h -DNAME=kName -P embed_text.cmake
file(READ "${INPUT}" text)
string(FIND "${text}" ")winnow_text\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${INPUT} contains the raw string's delimiter")
endif()
file(WRITE "${OUTPUT}.tmp"
  "// Generated from ${INPUT} by cmake/embed_text.cmake; do not edit.\n#pragma once\n"
  "inline constexpr char ${NAME}[] = R\"winnow_text(${text})winnow_text\";\n")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
