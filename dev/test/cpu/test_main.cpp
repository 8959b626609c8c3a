// The CPU unit tests' entry point (doctest). Each dev/test/cpu/test_*.cpp adds its own TEST_CASEs.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
