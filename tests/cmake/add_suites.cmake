# Included by ctest (the directory's TEST_INCLUDE_FILES) before it runs: lists the suites of the
# test binary WM_TESTS_BIN and adds one ctest test per GoogleTest suite, which runs the suite's
# tests in one process (--gtest_filter='Suite.*'). A process that links libtorch takes about
# 0.5 s to start; one per suite instead of one per test saves that for 500 tests in 140 suites.
# A suite whose tests all skip (a CUDA suite without a device) is reported as skipped.
if(NOT EXISTS "${WM_TESTS_BIN}")
  add_test(wm_tests_not_built "${WM_TESTS_BIN}")
  return()
endif()
execute_process(COMMAND "${WM_TESTS_BIN}" --gtest_list_tests
                WORKING_DIRECTORY "${WM_TESTS_DIR}"
                OUTPUT_VARIABLE listing ERROR_VARIABLE listing_err RESULT_VARIABLE listing_rc
                TIMEOUT 60)
if(NOT listing_rc EQUAL 0)
  message(FATAL_ERROR "${WM_TESTS_BIN} --gtest_list_tests failed (${listing_rc}):\n${listing}${listing_err}")
endif()
string(REPLACE "\n" ";" lines "${listing}")
foreach(line IN LISTS lines)
  # Suite lines have no indent and end with '.', maybe followed by "  # TypeParam = ...".
  if(line MATCHES "^([^ #][^ ]*)\\.( .*)?$")
    set(suite "${CMAKE_MATCH_1}")
    add_test("${suite}" "${WM_TESTS_BIN}" "--gtest_filter=${suite}.*")
    set_tests_properties("${suite}" PROPERTIES
      WORKING_DIRECTORY "${WM_TESTS_DIR}"
      SKIP_REGULAR_EXPRESSION "\\[  PASSED  \\] 0 tests\\.")
  endif()
endforeach()
