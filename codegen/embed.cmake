# cmake -DIN=file.cuh -DOUT=file.c -DSYMBOL=name -P embed.cmake: the CUDA text of IN as the C
# string `const char SYMBOL[]` in OUT, one source line a literal, so generated kernels carry
# it byte for byte.
file(READ "${IN}" text)
string(REPLACE "\\" "\\\\" text "${text}")
string(REPLACE "\"" "\\\"" text "${text}")
string(REPLACE "\n" "\\n\"\n    \"" text "${text}")
file(WRITE "${OUT}" "/* generated from ${IN} by codegen/embed.cmake: do not edit */\nconst char ${SYMBOL}[] =\n    \"${text}\";\n")
