// Boost.Asio, included the one way that compiles here: Boost 1.74's awaitable.hpp uses std::exchange without
// including <utility>, which GCC 12 in C++20 mode no longer brings in indirectly.
#pragma once

// clang-format off
#include <utility>
#include <boost/asio.hpp>
// clang-format on
