# Planner benchmarks: search speed (bench/search_speed.cc) and the calibration report (bench/calibration_report.cc).
dtrain_executable(search_speed SOURCES search_speed.cc DEPS dtrain::plan dtrain_testsupport)
target_compile_definitions(search_speed PRIVATE DTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
dtrain_executable(ir_speed SOURCES ir_speed.cc DEPS dtrain::ir)
target_compile_definitions(ir_speed PRIVATE DTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
