#pragma once
// RAII owners for the SDL handles the viewer holds: the library itself, windows, renderers and
// textures. Each owner destroys its handle exactly once; moving transfers ownership.
#include <SDL.h>

#include <memory>
#include <string>

#include "runtime/error.h"

namespace wm::viewer {

struct SdlWindowDeleter {
  void operator()(SDL_Window* w) const { SDL_DestroyWindow(w); }
};
struct SdlRendererDeleter {
  void operator()(SDL_Renderer* r) const { SDL_DestroyRenderer(r); }
};
struct SdlTextureDeleter {
  void operator()(SDL_Texture* t) const { SDL_DestroyTexture(t); }
};

using WindowPtr = std::unique_ptr<SDL_Window, SdlWindowDeleter>;
using RendererPtr = std::unique_ptr<SDL_Renderer, SdlRendererDeleter>;
using TexturePtr = std::unique_ptr<SDL_Texture, SdlTextureDeleter>;

// SDL_Init / SDL_Quit for the given subsystems. Throws wm::Error with SDL's message on failure.
class SdlLibrary {
 public:
  explicit SdlLibrary(Uint32 flags) {
    if (SDL_Init(flags) != 0) throw Error(std::string("SDL_Init: ") + SDL_GetError());
  }
  ~SdlLibrary() { SDL_Quit(); }
  SdlLibrary(const SdlLibrary&) = delete;
  SdlLibrary& operator=(const SdlLibrary&) = delete;
};

// "what: SDL's last error" for messages.
inline std::string sdl_error(const std::string& what) { return what + ": " + SDL_GetError(); }

// A streaming RGB24 texture that is recreated only when the frame size changes.
class StreamingTexture {
 public:
  // Uploads an RGB24 image of w x h (rows of w * 3 bytes), recreating the texture if the size
  // differs from the last upload. Throws wm::Error with SDL's message on failure.
  void upload(SDL_Renderer* r, int w, int h, const uint8_t* rgb) {
    if (!tex_ || w != w_ || h != h_) {
      tex_.reset(SDL_CreateTexture(r, SDL_PIXELFORMAT_RGB24, SDL_TEXTUREACCESS_STREAMING, w, h));
      if (!tex_) throw Error(sdl_error("SDL_CreateTexture " + std::to_string(w) + "x" + std::to_string(h)));
      SDL_SetTextureScaleMode(tex_.get(), SDL_ScaleModeNearest);
      w_ = w;
      h_ = h;
    }
    if (SDL_UpdateTexture(tex_.get(), nullptr, rgb, w * 3) != 0) throw Error(sdl_error("SDL_UpdateTexture"));
  }
  SDL_Texture* get() const { return tex_.get(); }
  explicit operator bool() const { return static_cast<bool>(tex_); }
  int width() const { return w_; }
  int height() const { return h_; }

 private:
  TexturePtr tex_;
  int w_ = 0, h_ = 0;
};

}  // namespace wm::viewer
