#pragma once
// The viewer's Matrix-Game-2.0 path: the same window, script, screenshot, recording and pacing as
// the tiny model's, driving a worldkv::WorldSession over a worldkv::Mg2Adapter from the keys and mouse as the model's mode
// reads them (viewer/mg2_input.h). The UI samples the held input on the frame clock, one
// Mg2Input per video frame, 9 for the first chunk and 12 for each later one, and hands a chunk's
// worth to the worker (viewer/mg2_generator.h) when the previous chunk is done; the decoded
// frames are shown at the same clock as they come.
#include <string>

#include "viewer/app.h"

namespace wm::viewer {

// True when the options name a Matrix-Game-2.0 model: `mode` given, `model_path` a folder, or
// a file with a config.json beside it whose _class_name is CausalWanModel.
bool is_mg2_model(const std::string& model_path, const std::string& mode);

// `given` if set, else `name` in the folder above the model's folder (the hub's layout:
// Matrix-Game-2.0/base_distilled_model/... beside Matrix-Game-2.0/Wan2.1_VAE.pth).
std::string mg2_file_beside_model(const std::string& model_path, const std::string& given, const std::string& name);

// Runs the Matrix-Game-2.0 viewer (see run_viewer). Throws wm::Error for a missing or
// contradicting model, mode, VAE, CLIP or condition before the window opens.
ViewerSummary run_mg2_viewer(const ViewerOptions& options);

}  // namespace wm::viewer
