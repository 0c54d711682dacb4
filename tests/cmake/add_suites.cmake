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
# ctest starts the costliest tests first when it knows their costs; a fresh build has no record
# of them, so the suites that took longest give theirs (seconds on a 2-core machine, 2026-11-26):
# without it, the last suite listed (Mg2Conformance, 23 s) ran alone at the end.
set(wm_suite_costs BadInput 61 Rollout 27 Modes/Mg2Conformance 23 LlmHardening 23 ViewerProgram 22
    TrainResume 16 Serve 14 DitModel 13 KvStoreCli 12 WaitPolicy 12)
# Every program that links wm_runtime re-executes itself once when it starts without an OpenMP
# wait policy, so that libgomp reads OMP_WAIT_POLICY=passive (runtime/omp_wait_policy.cpp): the
# dynamic loader's work twice, about 0.15 s of CPU a start of wm_tests, 170 starts. Giving the
# suites the policy spares that; a policy or spin count the user set when starting ctest is kept.
set(wm_suite_env "")
if(NOT DEFINED ENV{OMP_WAIT_POLICY} AND NOT DEFINED ENV{GOMP_SPINCOUNT})
  set(wm_suite_env "OMP_WAIT_POLICY=passive")
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
    if(wm_suite_env)
      set_tests_properties("${suite}" PROPERTIES ENVIRONMENT "${wm_suite_env}")
    endif()
    list(FIND wm_suite_costs "${suite}" at)
    if(at GREATER_EQUAL 0)
      math(EXPR at "${at} + 1")
      list(GET wm_suite_costs ${at} cost)
      set_tests_properties("${suite}" PROPERTIES COST ${cost})
    endif()
  endif()
endforeach()
