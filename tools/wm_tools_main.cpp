// The main of wm_tools (tools/wm_tools.h).
#include "tools/wm_tools.h"

int main(int argc, char** argv) { return wm::tools::run(argc, argv); }
