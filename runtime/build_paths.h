#pragma once
// The folders of the checkout and the build a binary was configured from, for the tests (their
// fixtures, the programs they run) and the few library parts that find a file of the build (the
// umT5 tokenizer's SentencePiece module, the viewer's assets). Defined in one unit that CMake
// writes into the build folder (wm_build_paths.cpp, CMakeLists.txt) rather than passed as -D flags
// to every unit of those targets: the other units then compile to the same objects wherever the
// checkout is, and the compiler cache serves a second clone from the first one's (tools/README.md,
// "Building"). The targets that used the paths as -D flags keep their macro names, now naming
// these (WM_SOURCE_DIR, WM_BINARY_DIR, WM_VIEWER_BIN, WM_VIEWER_SOURCE_DIR,
// WM_SENTENCEPIECE_MODULE); a unit using one includes this header.
namespace wm::build_paths {
extern const char* const source_dir;            // the checkout (CMake's PROJECT_SOURCE_DIR)
extern const char* const binary_dir;            // the build folder (PROJECT_BINARY_DIR)
extern const char* const viewer_bin;            // wm_viewer; "" when it is not built
extern const char* const sentencepiece_module;  // libwm_sentencepiece.so; "" when it is not built
}  // namespace wm::build_paths
