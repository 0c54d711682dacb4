#pragma once
// The interactive viewer: an SDL2 window that runs a world model live, the same loop for every
// model kind. The UI thread polls events, samples the held input on a frame clock into one control
// per video frame (the model view's: viewer/model_view.h), hands a chunk's worth to the
// generation worker (viewer/generator.h) when the previous chunk is done, and shows the finished
// frames at the same clock as they come, with the HUD, the window-regions bar, the latency graph
// and the view's panel; it records, takes screenshots, plays scripts and writes the run's
// summary. A script can drive it headless (tests, demos) and it can exit after N chunks.
#include <memory>

#include "viewer/model_view.h"
#include "viewer/options.h"
#include "viewer/summary.h"

namespace wm::viewer {

// The model view for the options: Matrix-Game-2.0's when is_mg2_model says so, else the tiny
// model's. Nothing is loaded yet.
std::unique_ptr<ModelView> make_view(const ViewerOptions& options);

// Runs the viewer until quit, the chunk/frame limit or the end of the script. Throws wm::Error
// (model missing or contradicting its files, SDL failure, bad script, timeout) with a message for
// the user; errors of the model's files come before the window opens.
ViewerSummary run_viewer(const ViewerOptions& options);

// The help overlay's key lines for a view: its steering keys, then the policies it takes, the
// ground truth (where it has one), recording, its new start, pause, help and quit.
std::string help_text(const ModelView& view);

}  // namespace wm::viewer
