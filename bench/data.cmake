# Data benchmarks: tokenizer speed and memory (bench/tokenizer_speed.cc), run next to the references by
# bench/tokenizer_vs_reference.sh (results in bench/results/tokenizers.md).
#   build/bin/tokenizer_speed TOKENIZER TEXT_FILE [REPEAT]
dtrain_executable(tokenizer_speed SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/tokenizer_speed.cc DEPS dtrain::tokenizers)
