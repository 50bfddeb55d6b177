# cmake -DIN=file.cuh -DOUT=file.c -DSYMBOL=name -P embed.cmake: the CUDA text of IN as the C
# string `const char SYMBOL[]` in OUT, one source line a literal, so generated kernels carry
# it byte for byte. The file's leading // lines are its documentation for the reader of this
# repository (what the text needs defined before it); they are not embedded.
file(READ "${IN}" text)
string(REGEX REPLACE "^(//[^\n]*\n)+" "" text "${text}")
string(REPLACE "\\" "\\\\" text "${text}")
string(REPLACE "\"" "\\\"" text "${text}")
string(REPLACE "\n" "\\n\"\n    \"" text "${text}")
file(WRITE "${OUT}" "/* generated from ${IN} by codegen/embed.cmake: do not edit */\nconst char ${SYMBOL}[] =\n    \"${text}\";\n")
