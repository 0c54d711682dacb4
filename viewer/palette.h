#pragma once
// The viewer's colours, one place: HUD text, the window regions, the minimap.
#include <SDL.h>

namespace wm::viewer::palette {

constexpr SDL_Color kBackground{18, 19, 24, 255};
constexpr SDL_Color kPanel{28, 30, 38, 255};
constexpr SDL_Color kText{230, 230, 230, 255};  // HUD text (tests look for this exact colour)
constexpr SDL_Color kDim{140, 145, 160, 255};
constexpr SDL_Color kAccent{120, 200, 255, 255};
constexpr SDL_Color kWarn{255, 90, 80, 255};
constexpr SDL_Color kSink{90, 140, 255, 255};
constexpr SDL_Color kRetrieved{255, 160, 40, 255};
constexpr SDL_Color kRecent{90, 200, 110, 255};
constexpr SDL_Color kDenoise{200, 200, 210, 255};
constexpr SDL_Color kBanked{170, 160, 90, 255};
constexpr SDL_Color kWall{72, 74, 88, 255};
constexpr SDL_Color kLandmark{170, 95, 200, 255};
constexpr SDL_Color kFloor{34, 36, 44, 255};
constexpr SDL_Color kTrail{80, 220, 230, 255};
constexpr SDL_Color kCamera{255, 255, 255, 255};

// The colour of a window region by name ("sink", "retrieved", "recent", "denoise").
inline SDL_Color region_color(const char* name) {
  switch (name[0]) {
    case 's': return kSink;
    case 'r': return name[2] == 't' ? kRetrieved : kRecent;  // "retrieved" / "recent"
    default: return kDenoise;
  }
}

inline void set_color(SDL_Renderer* r, SDL_Color c) { SDL_SetRenderDrawColor(r, c.r, c.g, c.b, c.a); }

}  // namespace wm::viewer::palette
