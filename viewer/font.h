#pragma once
// The viewer's text: DejaVu Sans Mono (Debian's fonts-dejavu-core) through SDL2_ttf, antialiased.
// Each size's printable ASCII is rendered once into a white atlas texture (a monospace font
// without kerning puts character i at i advances), and text is drawn from it per character,
// tinted; a character outside 32..126 draws as '?'. Sizes go by scale: 1 captions, 2 the HUD,
// 4 banners.
#include <SDL.h>

#include <array>
#include <memory>
#include <string>

#include "viewer/sdl_handles.h"

namespace wm::viewer {

// The font file: $WM_VIEWER_FONT when set, else the one CMake found (WM_VIEWER_FONT_FILE:
// /usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf).
std::string font_path();

// Pixel size of the font at scale 1, 2, 4 (others: the nearest of those).
int font_pixels(int scale);

class Font {
 public:
  // Opens `path` at every size and builds the atlases on r. Throws wm::Error naming the file
  // (and the package that installs it) or with SDL_ttf's message.
  Font(SDL_Renderer* r, const std::string& path);
  ~Font();
  Font(const Font&) = delete;
  Font& operator=(const Font&) = delete;

  // Draws text with its top-left at (x, y) in colour c; '\n' starts a new line. Returns the x
  // just past the widest line.
  int draw(int x, int y, const std::string& text, SDL_Color c, int scale = 2) const;
  // Width and height in pixels of text at this scale (widest line, all lines).
  int width(const std::string& text, int scale = 2) const;
  int height(const std::string& text, int scale = 2) const;
  // A character's advance and a line's height at this scale.
  int advance(int scale = 2) const;
  int line_height(int scale = 2) const;

 private:
  struct Size;  // one size's font (SDL_ttf's, kept out of this header) and atlas
  const Size& size(int scale) const;

  SDL_Renderer* r_;
  bool ttf_init_ = false;
  std::array<std::unique_ptr<Size>, 3> sizes_;  // scales 1, 2, 4
};

}  // namespace wm::viewer
