// wm_tools: the programs of tools/ that link libtorch, in one executable (tools/CMakeLists.txt).
// Each program's name in the build tree is a symbolic link to it (build/tools/render/wm_render),
// and it runs the program named by the name it was started under; `wm_tools PROGRAM [ARGS...]`
// runs one by its name, with or without the "wm_" prefix. The dispatcher (tools/wm_tools.h);
// the executable's main is wm_tools_main.cpp.
#include "tools/wm_tools.h"

#include <cstdio>
#include <cstring>
#include <vector>

#include "wm_tools_table.h"  // generated: WM_TOOLS, a WM_TOOL(name) for each program built

#define WM_TOOL(name)                \
  namespace wm_tool_##name {         \
  int main(int argc, char** argv);   \
  }
WM_TOOLS
#undef WM_TOOL

namespace {

struct Program {
  const char* name;  // "wm_render"
  int (*main)(int, char**);
};

#define WM_TOOL(name) {"wm_" #name, &wm_tool_##name::main},
const Program kPrograms[] = {WM_TOOLS};
#undef WM_TOOL

const char* base_name(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

// The program called `name` ("wm_render", or "render" when `bare` is allowed), or null.
const Program* find(const char* name, bool bare) {
  for (const Program& p : kPrograms) {
    if (std::strcmp(p.name, name) == 0) return &p;
    if (bare && std::strcmp(p.name + 3, name) == 0) return &p;
  }
  return nullptr;
}

void usage(std::FILE* out) {
  std::fprintf(out,
               "Usage: wm_tools PROGRAM [ARGS...]\n"
               "Runs one of the project's programs (they are also this executable under their own\n"
               "names, build/tools/<folder>/wm_<folder>). Each program's --help describes it.\n"
               "Programs:\n");
  for (const Program& p : kPrograms) std::fprintf(out, "  %s\n", p.name);
}

}  // namespace

namespace wm::tools {

bool has_program(const char* path) { return path != nullptr && find(base_name(path), false) != nullptr; }

int run(int argc, char** argv) {
  if (argc < 1 || argv[0] == nullptr) {
    usage(stderr);
    return 2;
  }
  if (const Program* p = find(base_name(argv[0]), false)) return p->main(argc, argv);
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    usage(stdout);
    return 0;
  }
  const Program* p = find(argv[1], true);
  if (p == nullptr) {
    std::fprintf(stderr, "wm_tools: no program '%s' in this build\n", argv[1]);
    usage(stderr);
    return 2;
  }
  // The program sees its own name first, as when it is started through its link.
  std::vector<char*> args(argv + 1, argv + argc);
  args[0] = const_cast<char*>(p->name);
  args.push_back(nullptr);
  return p->main(argc - 1, args.data());
}

}  // namespace wm::tools
