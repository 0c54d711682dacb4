#include "viewer/font.h"

#include <SDL_ttf.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "runtime/error.h"

#ifndef WM_VIEWER_FONT_FILE
#define WM_VIEWER_FONT_FILE "/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf"
#endif

namespace wm::viewer {
namespace {

constexpr int kFirst = 32, kCount = 95;  // printable ASCII

int size_index(int scale) { return scale <= 1 ? 0 : scale < 4 ? 1 : 2; }

int glyph_index(char c) {
  const int u = static_cast<unsigned char>(c);
  return (u >= kFirst && u < kFirst + kCount) ? u - kFirst : '?' - kFirst;
}

}  // namespace

struct Font::Size {
  TTF_Font* font = nullptr;
  TexturePtr atlas;  // the 95 printable characters in a row, white on transparent
  int advance = 0, line = 0, height = 0;
};

std::string font_path() {
  const char* env = std::getenv("WM_VIEWER_FONT");
  return env != nullptr && *env ? std::string(env) : std::string(WM_VIEWER_FONT_FILE);
}

int font_pixels(int scale) {
  static const int px[3] = {12, 16, 32};
  return px[size_index(scale)];
}

Font::Font(SDL_Renderer* r, const std::string& path) : r_(r) {
  if (!std::filesystem::exists(path))
    throw Error(str_cat("no font at '", path, "' (Debian's fonts-dejavu-core installs DejaVuSansMono.ttf; ",
                        "WM_VIEWER_FONT names another)"));
  if (TTF_Init() != 0) throw Error(str_cat("TTF_Init: ", TTF_GetError()));
  ttf_init_ = true;
  std::string all;
  for (int i = 0; i < kCount; ++i) all += static_cast<char>(kFirst + i);
  static const int kScales[3] = {1, 2, 4};
  for (int s = 0; s < 3; ++s) {
    sizes_[s] = std::make_unique<Size>();
    Size& z = *sizes_[s];
    z.font = TTF_OpenFont(path.c_str(), font_pixels(kScales[s]));
    if (z.font == nullptr) throw Error(str_cat("TTF_OpenFont '", path, "': ", TTF_GetError()));
    TTF_SetFontKerning(z.font, 0);
    TTF_SetFontHinting(z.font, TTF_HINTING_NORMAL);
    int minx = 0, maxx = 0, miny = 0, maxy = 0;
    if (TTF_GlyphMetrics(z.font, 'M', &minx, &maxx, &miny, &maxy, &z.advance) != 0 || z.advance <= 0)
      throw Error(str_cat("TTF_GlyphMetrics '", path, "': ", TTF_GetError()));
    z.height = TTF_FontHeight(z.font);
    z.line = std::max(z.height, TTF_FontLineSkip(z.font));
    SDL_Surface* row = TTF_RenderUTF8_Blended(z.font, all.c_str(), SDL_Color{255, 255, 255, 255});
    if (row == nullptr) throw Error(str_cat("TTF_RenderUTF8_Blended: ", TTF_GetError()));
    const bool mono = row->w == z.advance * kCount;
    z.atlas.reset(SDL_CreateTextureFromSurface(r, row));
    SDL_FreeSurface(row);
    if (!mono) throw Error(str_cat("'", path, "' is not a monospace font (the viewer lays text out by advances)"));
    if (!z.atlas) throw Error(sdl_error("Font: SDL_CreateTextureFromSurface"));
    SDL_SetTextureBlendMode(z.atlas.get(), SDL_BLENDMODE_BLEND);
  }
}

Font::~Font() {
  for (auto& z : sizes_)
    if (z && z->font) TTF_CloseFont(z->font);
  for (auto& z : sizes_) z.reset();
  if (ttf_init_) TTF_Quit();
}

const Font::Size& Font::size(int scale) const { return *sizes_[size_index(scale)]; }
int Font::advance(int scale) const { return size(scale).advance; }
int Font::line_height(int scale) const { return size(scale).line; }

int Font::draw(int x, int y, const std::string& text, SDL_Color c, int scale) const {
  const Size& z = size(scale);
  SDL_SetTextureColorMod(z.atlas.get(), c.r, c.g, c.b);
  SDL_SetTextureAlphaMod(z.atlas.get(), c.a);
  int cx = x, cy = y, right = x;
  for (char ch : text) {
    if (ch == '\n') {
      cx = x;
      cy += z.line;
      continue;
    }
    if (ch != ' ') {
      const SDL_Rect src{glyph_index(ch) * z.advance, 0, z.advance, z.height};
      const SDL_Rect dst{cx, cy, z.advance, z.height};
      SDL_RenderCopy(r_, z.atlas.get(), &src, &dst);
    }
    cx += z.advance;
    right = std::max(right, cx);
  }
  return right;
}

int Font::width(const std::string& text, int scale) const {
  int best = 0, cur = 0;
  for (char ch : text) {
    if (ch == '\n') cur = 0;
    else best = std::max(best, ++cur);
  }
  return best * size(scale).advance;
}

int Font::height(const std::string& text, int scale) const {
  const Size& z = size(scale);
  return static_cast<int>(std::count(text.begin(), text.end(), '\n')) * z.line + z.height;
}

}  // namespace wm::viewer
