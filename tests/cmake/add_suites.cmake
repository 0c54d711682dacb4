# Included by ctest (the directory's TEST_INCLUDE_FILES) before it runs: lists the suites of the
# test binary WM_TESTS_BIN and adds ctest tests that run them. A process that links libtorch takes
# about 0.45 s of CPU to start (the dynamic loader binding libtorch's symbols: Debian's is linked
# BIND_NOW), more than most suites' own tests take: the suites with a measured cost, and those run
# by name as checks, run alone (--gtest_filter='Suite.*'); every other one runs in a batch of up
# to 16 suites, one process (--gtest_filter='A.*:B.*:...'), named after its suites joined by '+'
# so that `ctest -R Suite` still finds it: the 146 suites batched so took 87 s of CPU one process
# each and take 20 s in 10 batches (2026-11-28). A test whose tests all skip (the CUDA suites,
# batched apart, without a device) is reported as skipped.
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
# of them, so the suites that take longest give theirs (seconds of CPU on a 2-core machine,
# 2026-11-28; those whose programs now fork, tests/README.md, 2026-11-29): without it, the last
# suite listed (Mg2Conformance, 23 s) ran alone at the end.
# These run alone, as do the architecture checks that are run by name.
set(wm_suite_costs ViewerProgram 30 Modes/Mg2Conformance 23 Smollm2 20 LlmHardening 20 Rollout 17
    TrainResume 12 BadInput 11 DitModel 11 Serve 8 WaitPolicy 6 LlmLearning 6 KilledRender 7
    KvStoreCli 4 KvStoreBenchCli 4 LlmSessionCli 3 LlmTrainRun 3 PlanBenchRun 3 PthConvert 3 LingbotRender 2)
set(wm_suites_alone FunctionLength Layering DocLinks FuzzSources)
set(wm_batch_size 16)
# Every program that links wm_runtime re-executes itself once when it starts without an OpenMP
# wait policy, so that libgomp reads OMP_WAIT_POLICY=passive (runtime/omp_wait_policy.cpp): the
# dynamic loader's work twice, about 0.15 s of CPU each start of wm_tests. Giving the
# suites the policy spares that where no OpenBLAS kernel set is to be added too (on an Intel CPU
# with AVX2 one is, and wm_tests starts twice; the programs the suites start inherit both
# variables from it and start once); a policy or spin count the user set when starting ctest is kept.
set(wm_suite_env "")
if(NOT DEFINED ENV{OMP_WAIT_POLICY} AND NOT DEFINED ENV{GOMP_SPINCOUNT})
  set(wm_suite_env "OMP_WAIT_POLICY=passive")
endif()
# The suites whose programs run forked from the test process (tests/cli/program_runner.h,
# Launch::Forked): a forked program's OpenMP takes the test process's settings, read when it
# loaded, so these start with those an executed program gets, one thread (and passive, above);
# a thread count the user set is kept, and their runs are then executed.
set(wm_forking_suites BadInput Serve KvStoreCli LlmSessionCli LingbotRender TrainResume)
# One ctest test running the suites `suites` in one process.
function(wm_add_suites_test suites)
  string(REPLACE ";" "+" name "${suites}")
  string(REPLACE ";" ".*:" filter "${suites}")
  add_test("${name}" "${WM_TESTS_BIN}" "--gtest_filter=${filter}.*")
  set_tests_properties("${name}" PROPERTIES
    WORKING_DIRECTORY "${WM_TESTS_DIR}"
    SKIP_REGULAR_EXPRESSION "\\[  PASSED  \\] 0 tests\\.")
  set(env ${wm_suite_env})
  list(FIND wm_forking_suites "${suites}" forking)
  if(forking GREATER_EQUAL 0 AND NOT DEFINED ENV{OMP_NUM_THREADS})
    list(APPEND env "OMP_NUM_THREADS=1")
  endif()
  if(env)
    set_tests_properties("${name}" PROPERTIES ENVIRONMENT "${env}")
  endif()
  list(FIND wm_suite_costs "${suites}" at)
  if(at GREATER_EQUAL 0)
    math(EXPR at "${at} + 1")
    list(GET wm_suite_costs ${at} cost)
    set_tests_properties("${name}" PROPERTIES COST ${cost})
  endif()
endfunction()

string(REPLACE "\n" ";" lines "${listing}")
set(batch "")
set(cuda_batch "")
foreach(line IN LISTS lines)
  # Suite lines have no indent and end with '.', maybe followed by "  # TypeParam = ...".
  if(line MATCHES "^([^ #][^ ]*)\\.( .*)?$")
    set(suite "${CMAKE_MATCH_1}")
    list(FIND wm_suite_costs "${suite}" costed)
    list(FIND wm_suites_alone "${suite}" alone)
    if(costed GREATER_EQUAL 0 OR alone GREATER_EQUAL 0)
      wm_add_suites_test("${suite}")
    elseif(suite MATCHES "^Cuda")  # apart, so that without a device their batch shows as skipped
      list(APPEND cuda_batch "${suite}")
    else()
      list(APPEND batch "${suite}")
      list(LENGTH batch n)
      if(n EQUAL wm_batch_size)
        wm_add_suites_test("${batch}")
        set(batch "")
      endif()
    endif()
  endif()
endforeach()
foreach(rest IN ITEMS batch cuda_batch)
  if(${rest})
    wm_add_suites_test("${${rest}}")
  endif()
endforeach()
