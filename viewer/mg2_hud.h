#pragma once
// Matrix-Game-2.0's parts of the HUD: the input of a frame as text, the mode's steering keys for
// the help, and the panel: the retrieval pose's track seen from above.
#include <SDL.h>

#include <string>
#include <vector>

#include "viewer/font.h"
#include "viewer/generator.h"
#include "worldkv/action.h"
#include "worldkv/pose.h"

namespace wm::viewer {

// The track of retrieval poses (x, y) from above, fitted into `area` with equal axes: the path,
// the chunks in the window (region colours, when the memory has chunk poses) and the camera at
// `camera` with its heading.
void draw_mg2_track(SDL_Renderer* r, const Font& font, const SDL_Rect& area, const std::vector<worldkv::Pose>& track,
                    const MemorySnapshot* mem, const worldkv::Pose& camera);
// "W . . D" for universal's keys, "W ." for gta_drive's, the action's name for templerun's.
std::string format_mg2_keys(const worldkv::Mg2Input& in, const std::vector<std::string>& names);
// The steering keys of a mode for the help overlay (also printed by --help).
std::string mg2_help_keys(const std::string& mode);

}  // namespace wm::viewer
