#pragma once
// A small embedded bitmap font (5x7 glyphs, descenders of g j p q y below the baseline, in 6x10
// cells, printable ASCII) drawn through a glyph atlas texture: no font files, no SDL_ttf. Glyphs
// scale by whole factors so text stays crisp.
#include <SDL.h>

#include <array>
#include <cstdint>
#include <string>

#include "viewer/sdl_handles.h"

namespace wm::viewer {

constexpr int kGlyphW = 5, kGlyphH = 9;  // pixel rows of a glyph: 7 above the baseline, 2 below
constexpr int kCellW = 6, kCellH = 10;   // advance and line height at scale 1

// Column bits of the glyph for c (bit 0 = top row); characters outside 32..126 draw as '?'.
std::array<uint16_t, kGlyphW> glyph_columns(char c);

class BitmapFont {
 public:
  // Builds the atlas texture on `r`. Throws wm::Error with SDL's message on failure.
  explicit BitmapFont(SDL_Renderer* r);

  // Draws one line of text with its top-left at (x, y), each font pixel scale x scale screen
  // pixels, in colour c. '\n' starts a new line. Returns the x just past the widest line.
  int draw(int x, int y, const std::string& text, SDL_Color c, int scale = 2) const;
  // Width and height in screen pixels of text drawn at this scale (widest line, all lines).
  static int width(const std::string& text, int scale = 2);
  static int height(const std::string& text, int scale = 2);

 private:
  SDL_Renderer* r_;
  TexturePtr atlas_;
};

}  // namespace wm::viewer
