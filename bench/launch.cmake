# dtlaunch start-up: launch_bench runs dtlaunch with 1, 8 and 64 trivial ranks (itself with --rank: heartbeat, store
# barrier, exit) and, with --dtexec, tiny dtexec ranks; it reads the phases from dtlaunch's --run-dir events.
dtrain_executable(launch_bench SOURCES launch_bench.cc DEPS dtrain::exec_heartbeat dtrain::store nlohmann_json::nlohmann_json fmt::fmt)
add_dependencies(launch_bench dtlaunch)
target_compile_definitions(launch_bench PRIVATE DTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
