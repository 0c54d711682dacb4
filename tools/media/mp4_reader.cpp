#include "tools/media/mp4_reader.h"

#include <cstring>

#include "tools/media/ffmpeg_util.h"

namespace wm::media {

using namespace detail;

namespace {
std::string where(const std::string& path) { return "VideoReader(" + path + ")"; }
}  // namespace

struct VideoReader::Impl {
  std::string path;
  InputFormatPtr fmt;
  CodecContextPtr codec;
  FramePtr frame;
  PacketPtr packet;
  SwsPtr sws;
  int stream_index = -1;
  AVRational rate{0, 1};
  int64_t declared_frames = -1;
  int64_t frames = 0;
  bool input_done = false;    // no more packets to send
  bool decoder_done = false;  // decoder returned EOF
  // The converter's current source, to rebuild it when a frame's size or format changes.
  int sws_w = 0, sws_h = 0, sws_fmt = -1;

  // Receives one decoded frame into `frame`; true on success, false when the decoder needs
  // more input or is drained.
  bool receive() {
    int ret = avcodec_receive_frame(codec.get(), frame.get());
    if (ret == AVERROR(EAGAIN)) return false;
    if (ret == AVERROR_EOF) {
      decoder_done = true;
      return false;
    }
    av_check(ret, where(path) + ": decoding frame " + std::to_string(frames));
    return true;
  }

  void to_rgb(wm::Image* out) {
    const int w = frame->width, h = frame->height;
    if (!sws || w != sws_w || h != sws_h || frame->format != sws_fmt) {
      sws.reset(sws_getContext(w, h, static_cast<AVPixelFormat>(frame->format), w, h, AV_PIX_FMT_RGB24,
                               SWS_BILINEAR | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INT, nullptr, nullptr,
                               nullptr));
      if (!sws) {
        const char* name = av_get_pix_fmt_name(static_cast<AVPixelFormat>(frame->format));
        throw wm::Error(where(path) + ": cannot convert pixel format " + (name ? name : "?") + " to RGB");
      }
      // Honour the stream's matrix and range (BT.601 limited when it does not say).
      int cs = SWS_CS_DEFAULT;
      if (frame->colorspace == AVCOL_SPC_BT709) cs = SWS_CS_ITU709;
      else if (frame->colorspace == AVCOL_SPC_BT2020_NCL || frame->colorspace == AVCOL_SPC_BT2020_CL)
        cs = SWS_CS_BT2020;
      const int src_full = frame->color_range == AVCOL_RANGE_JPEG ||
                           frame->format == AV_PIX_FMT_YUVJ420P || frame->format == AV_PIX_FMT_YUVJ444P;
      int* inv_table = nullptr;
      int* table = nullptr;
      int src_range = 0, dst_range = 0, brightness = 0, contrast = 0, saturation = 0;
      if (sws_getColorspaceDetails(sws.get(), &inv_table, &src_range, &table, &dst_range, &brightness,
                                   &contrast, &saturation) >= 0) {
        sws_setColorspaceDetails(sws.get(), sws_getCoefficients(cs), src_full, table, 1, brightness,
                                 contrast, saturation);
      }
      sws_w = w;
      sws_h = h;
      sws_fmt = frame->format;
    }
    wm::Image img(w, h);
    uint8_t* dst[1] = {img.rgb.data()};
    const int dst_stride[1] = {w * 3};
    sws_scale(sws.get(), frame->data, frame->linesize, 0, h, dst, dst_stride);
    *out = std::move(img);
  }
};

VideoReader::VideoReader(const std::string& path) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.path = path;
  quiet_default_ffmpeg_log();
  AVFormatContext* raw = nullptr;
  av_check(avformat_open_input(&raw, path.c_str(), nullptr, nullptr), where(path) + ": cannot open");
  m.fmt.reset(raw);
  av_check(avformat_find_stream_info(m.fmt.get(), nullptr), where(path) + ": reading stream info");
  const AVCodec* dec = nullptr;
  int idx = av_find_best_stream(m.fmt.get(), AVMEDIA_TYPE_VIDEO, -1, -1, &dec, 0);
  if (idx == AVERROR_STREAM_NOT_FOUND) throw wm::Error(where(path) + ": no video stream in the file");
  av_check(idx, where(path) + ": finding a decoder for the video stream");
  m.stream_index = idx;
  AVStream* st = m.fmt->streams[idx];
  m.codec.reset(avcodec_alloc_context3(dec));
  if (!m.codec) throw wm::Error(where(path) + ": out of memory allocating the decoder");
  av_check(avcodec_parameters_to_context(m.codec.get(), st->codecpar), where(path) + ": copying codec parameters");
  m.codec->thread_count = 0;  // let libavcodec choose
  av_check(avcodec_open2(m.codec.get(), dec, nullptr), where(path) + ": opening decoder " + dec->name);
  m.rate = st->avg_frame_rate.num > 0 ? st->avg_frame_rate : st->r_frame_rate;
  if (m.rate.num <= 0 || m.rate.den <= 0) m.rate = AVRational{0, 1};
  m.declared_frames = st->nb_frames > 0 ? st->nb_frames : -1;
  m.frame.reset(av_frame_alloc());
  m.packet.reset(av_packet_alloc());
  if (!m.frame || !m.packet) throw wm::Error(where(path) + ": out of memory allocating a frame");
}

VideoReader::~VideoReader() = default;
VideoReader::VideoReader(VideoReader&&) noexcept = default;
VideoReader& VideoReader::operator=(VideoReader&&) noexcept = default;

bool VideoReader::read(wm::Image* out) {
  if (!impl_) throw wm::Error("VideoReader::read: reader was moved from");
  Impl& m = *impl_;
  while (!m.decoder_done) {
    if (m.receive()) {
      m.to_rgb(out);
      av_frame_unref(m.frame.get());
      ++m.frames;
      return true;
    }
    if (m.decoder_done) break;
    if (m.input_done) {
      // Flush already sent and the decoder wants more: nothing further will come.
      m.decoder_done = true;
      break;
    }
    // Feed packets of our stream until one is accepted, or signal the end.
    while (true) {
      int ret = av_read_frame(m.fmt.get(), m.packet.get());
      if (ret == AVERROR_EOF) {
        av_check(avcodec_send_packet(m.codec.get(), nullptr), where(m.path) + ": flushing the decoder");
        m.input_done = true;
        break;
      }
      av_check(ret, where(m.path) + ": reading a packet after frame " + std::to_string(m.frames));
      if (m.packet->stream_index != m.stream_index) {
        av_packet_unref(m.packet.get());
        continue;
      }
      ret = avcodec_send_packet(m.codec.get(), m.packet.get());
      av_packet_unref(m.packet.get());
      av_check(ret, where(m.path) + ": sending a packet to the decoder");
      break;
    }
  }
  return false;
}

std::vector<wm::Image> VideoReader::read_all() {
  std::vector<wm::Image> out;
  wm::Image img;
  while (read(&img)) out.push_back(std::move(img));
  return out;
}

int VideoReader::width() const { return impl_->codec->width; }
int VideoReader::height() const { return impl_->codec->height; }
int VideoReader::fps_num() const { return impl_->rate.num; }
int VideoReader::fps_den() const { return impl_->rate.den; }
double VideoReader::fps() const { return impl_->rate.num > 0 ? av_q2d(impl_->rate) : 0.0; }
int64_t VideoReader::frame_count() const { return impl_->declared_frames; }
int64_t VideoReader::frames_read() const { return impl_->frames; }
std::string VideoReader::codec_name() const { return impl_->codec->codec->name; }
const std::string& VideoReader::path() const { return impl_->path; }

int64_t VideoReader::count_frames(const std::string& path) {
  VideoReader r(path);
  wm::Image img;
  while (r.read(&img)) {
  }
  return r.frames_read();
}

}  // namespace wm::media
