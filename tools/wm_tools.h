// The dispatcher of wm_tools, the executable that holds the programs of tools/ that link
// libtorch (tools/CMakeLists.txt): its main (wm_tools_main.cpp), and the test binary's forked
// runs of a program (tests/cli/program_runner.h), call run().
#pragma once

namespace wm::tools {

// Runs the program that argv[0]'s file name names ("wm_render", as its link in the build folder
// is called), or, under any other name, `wm_tools PROGRAM [ARGS...]` (PROGRAM with or without the
// "wm_" prefix; --help lists them). Returns the program's exit status.
int run(int argc, char** argv);

// Whether the file name of `path` ("build/tools/render/wm_render") is a program of this build.
bool has_program(const char* path);

}  // namespace wm::tools
