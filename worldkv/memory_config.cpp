#include "worldkv/memory_config.h"

#include <utility>

#include "runtime/error.h"

namespace wm::worldkv {

void MemoryConfig::validate() const {
  WM_CHECK(frames_per_chunk > 0, "frames_per_chunk must be > 0, got ", frames_per_chunk);
  WM_CHECK(tokens_per_frame > 0, "tokens_per_frame must be > 0, got ", tokens_per_frame);
  for (auto [name, f] : {std::pair{"sink", sink_frames}, std::pair{"retrieved", retrieved_frames},
                         std::pair{"recent", recent_frames}, std::pair{"denoise", denoise_frames}})
    WM_CHECK(f >= 0 && f % frames_per_chunk == 0, name, " frames (", f, ") must be whole chunks of ",
             frames_per_chunk, " frames");
  WM_CHECK(denoise_frames == frames_per_chunk, "the denoise region is one chunk (", frames_per_chunk,
           " frames), got ", denoise_frames);
  WM_CHECK(sink_frames + retrieved_frames + recent_frames > 0, "the window holds no context");
}

}  // namespace wm::worldkv
