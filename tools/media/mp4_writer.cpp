#include "tools/media/mp4_writer.h"

#include <cstring>
#include <stdexcept>
#include <vector>

#include "tools/cli/output_file.h"
#include "tools/media/ffmpeg_util.h"
#include "tools/media/upscale.h"

extern "C" {
#include <libavutil/opt.h>
}

namespace wm::media {

using namespace detail;

namespace {

// Candidate H.264 encoders: libx264 first, then every other H.264 encoder libavcodec knows.
std::vector<const AVCodec*> h264_encoders() {
  std::vector<const AVCodec*> out;
  if (const AVCodec* x = avcodec_find_encoder_by_name("libx264")) out.push_back(x);
  void* it = nullptr;
  while (const AVCodec* c = av_codec_iterate(&it)) {
    if (c->id != AV_CODEC_ID_H264 || !av_codec_is_encoder(c)) continue;
    if (std::strcmp(c->name, "libx264") == 0 || std::strcmp(c->name, "libx264rgb") == 0) continue;
    out.push_back(c);
  }
  return out;
}

std::string where(const std::string& path) { return "Mp4Writer(" + path + ")"; }

}  // namespace

struct Mp4Writer::Impl {
  // Declared first, destroyed last: the muxer below closes the file before an uncommitted
  // temporary file is removed.
  std::unique_ptr<wm::cli::OutputPath> out;
  std::string path;
  int width = 0, height = 0, fps = 0, upscale = 1;
  int out_w = 0, out_h = 0;
  int frames = 0;
  bool open = false;      // accepts frames
  bool failed = false;    // finishing failed: the file is gone
  bool header_written = false;
  std::string encoder;

  OutputFormatPtr fmt;
  AVStream* stream = nullptr;  // owned by fmt
  CodecContextPtr codec;
  FramePtr yuv;
  PacketPtr packet;
  SwsPtr sws;
  wm::Image scaled;  // out_w x out_h: the frame after upscale + even padding

  ~Impl() {
    codec.reset();
    fmt.reset();  // closes the file; then `out` removes it unless it was committed
  }

  // Drains every packet the encoder has ready into the muxer. frame == nullptr flushes.
  void encode(AVFrame* frame) {
    av_check(avcodec_send_frame(codec.get(), frame), where(path) + ": sending a frame to " + encoder);
    while (true) {
      int ret = avcodec_receive_packet(codec.get(), packet.get());
      if (ret == AVERROR(EAGAIN) || ret == AVERROR_EOF) return;
      av_check(ret, where(path) + ": receiving a packet from " + encoder);
      av_packet_rescale_ts(packet.get(), codec->time_base, stream->time_base);
      packet->stream_index = stream->index;
      // av_interleaved_write_frame takes ownership of the packet's data and unrefs it.
      av_check(av_interleaved_write_frame(fmt.get(), packet.get()), where(path) + ": writing a packet");
    }
  }

  // Tries to open `enc` with our settings; returns the opened context or nullptr (error in *err).
  CodecContextPtr try_open(const AVCodec* enc, std::string* err) {
    CodecContextPtr c(avcodec_alloc_context3(enc));
    if (!c) throw wm::Error(where(path) + ": out of memory allocating the codec context");
    c->codec_id = AV_CODEC_ID_H264;
    c->width = out_w;
    c->height = out_h;
    c->time_base = AVRational{1, fps};
    c->framerate = AVRational{fps, 1};
    c->pix_fmt = AV_PIX_FMT_YUV420P;
    c->gop_size = 2 * fps;
    // swscale's RGB->YUV conversion is BT.601, limited range: say so in the stream.
    c->colorspace = AVCOL_SPC_SMPTE170M;
    c->color_primaries = AVCOL_PRI_SMPTE170M;
    c->color_trc = AVCOL_TRC_SMPTE170M;
    c->color_range = AVCOL_RANGE_MPEG;
    if (fmt->oformat->flags & AVFMT_GLOBALHEADER) c->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
    AVDictionary* opts = nullptr;
    if (std::strcmp(enc->name, "libx264") == 0) {
      av_dict_set(&opts, "preset", "fast", 0);
      av_dict_set(&opts, "crf", "18", 0);
    }
    int ret = avcodec_open2(c.get(), enc, &opts);
    av_dict_free(&opts);
    if (ret < 0) {
      *err += std::string(enc->name) + " (" + av_error_string(ret) + ") ";
      return nullptr;
    }
    return c;
  }
};

Mp4Writer::Mp4Writer(const std::string& path, int width, int height, int fps, int upscale)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.path = path;
  quiet_default_ffmpeg_log();
  if (width <= 0 || height <= 0 || fps <= 0 || upscale <= 0) {
    throw wm::Error(where(path) + ": width, height, fps and upscale must be positive, got " +
                                std::to_string(width) + "x" + std::to_string(height) + " @" +
                                std::to_string(fps) + " fps x" + std::to_string(upscale));
  }
  if (static_cast<long long>(width) * upscale > 16384 || static_cast<long long>(height) * upscale > 16384) {
    throw wm::Error(where(path) + ": scaled size " + std::to_string(width * 1LL * upscale) + "x" +
                                std::to_string(height * 1LL * upscale) + " exceeds 16384");
  }
  m.width = width;
  m.height = height;
  m.fps = fps;
  m.upscale = upscale;
  m.out_w = (width * upscale + 1) & ~1;
  m.out_h = (height * upscale + 1) & ~1;
  m.out = std::make_unique<wm::cli::OutputPath>(path);

  AVFormatContext* raw = nullptr;
  int ret = avformat_alloc_output_context2(&raw, nullptr, nullptr, path.c_str());
  if (ret < 0 || !raw) ret = avformat_alloc_output_context2(&raw, nullptr, "mp4", path.c_str());
  av_check(ret, where(path) + ": allocating the output context");
  m.fmt.reset(raw);

  std::string tried;
  for (const AVCodec* enc : h264_encoders()) {
    m.codec = m.try_open(enc, &tried);
    if (m.codec) {
      m.encoder = enc->name;
      break;
    }
  }
  if (!m.codec) {
    throw wm::Error(where(path) + ": no H.264 encoder could be opened; tried: " +
                             (tried.empty() ? std::string("none available in this libavcodec") : tried));
  }

  m.stream = avformat_new_stream(m.fmt.get(), nullptr);
  if (!m.stream) throw wm::Error(where(path) + ": could not add a stream");
  m.stream->time_base = m.codec->time_base;
  m.stream->avg_frame_rate = m.codec->framerate;
  av_check(avcodec_parameters_from_context(m.stream->codecpar, m.codec.get()),
           where(path) + ": copying the stream parameters");

  if (!(m.fmt->oformat->flags & AVFMT_NOFILE)) {
    av_check(avio_open(&m.fmt->pb, m.out->tmp().c_str(), AVIO_FLAG_WRITE), where(path) + ": cannot open for writing");
  }
  av_check(avformat_write_header(m.fmt.get(), nullptr), where(path) + ": writing the header");
  m.header_written = true;

  m.yuv.reset(av_frame_alloc());
  m.packet.reset(av_packet_alloc());
  if (!m.yuv || !m.packet) throw wm::Error(where(path) + ": out of memory allocating a frame");
  m.yuv->format = AV_PIX_FMT_YUV420P;
  m.yuv->width = m.out_w;
  m.yuv->height = m.out_h;
  av_check(av_frame_get_buffer(m.yuv.get(), 0), where(path) + ": allocating the frame buffer");

  m.sws.reset(sws_getContext(m.out_w, m.out_h, AV_PIX_FMT_RGB24, m.out_w, m.out_h, AV_PIX_FMT_YUV420P,
                             SWS_BILINEAR, nullptr, nullptr, nullptr));
  if (!m.sws) throw wm::Error(where(path) + ": could not create the RGB->YUV converter");
  m.scaled = wm::Image(m.out_w, m.out_h);
  m.open = true;
}

void Mp4Writer::write(const wm::Image& frame) {
  if (!impl_) throw wm::Error("Mp4Writer::write: writer was moved from");
  Impl& m = *impl_;
  if (!m.open) throw wm::Error(where(m.path) + ": write() after finish() or close()");
  if (frame.width != m.width || frame.height != m.height ||
      frame.rgb.size() != static_cast<size_t>(m.width) * m.height * 3) {
    throw wm::Error(where(m.path) + ": frame " + std::to_string(m.frames) + " is " +
                                std::to_string(frame.width) + "x" + std::to_string(frame.height) +
                                " (" + std::to_string(frame.rgb.size()) + " bytes), expected " +
                                std::to_string(m.width) + "x" + std::to_string(m.height));
  }
  // Nearest-neighbour integer upscale; the odd padding column/row repeats the last one.
  upscale_into(frame, m.upscale, m.scaled);
  const size_t row_bytes = static_cast<size_t>(m.out_w) * 3;
  if (m.width * m.upscale < m.out_w) {
    for (int y = 0; y < m.height * m.upscale; ++y)
      std::memcpy(m.scaled.pixel(m.out_w - 1, y), m.scaled.pixel(m.out_w - 2, y), 3);
  }
  if (m.height * m.upscale < m.out_h) std::memcpy(m.scaled.pixel(0, m.out_h - 1), m.scaled.pixel(0, m.out_h - 2), row_bytes);

  av_check(av_frame_make_writable(m.yuv.get()), where(m.path) + ": making the frame writable");
  const uint8_t* src_planes[1] = {m.scaled.rgb.data()};
  const int src_stride[1] = {static_cast<int>(row_bytes)};
  sws_scale(m.sws.get(), src_planes, src_stride, 0, m.out_h, m.yuv->data, m.yuv->linesize);
  m.yuv->pts = m.frames;
  m.encode(m.yuv.get());
  ++m.frames;
}

void Mp4Writer::finish() {
  if (!impl_ || !impl_->open) return;
  Impl& m = *impl_;
  m.open = false;  // whatever happens below, the writer takes no more frames
  try {
    m.encode(nullptr);
    av_check(av_write_trailer(m.fmt.get()), where(m.path) + ": writing the trailer");
    AVIOContext* pb = m.fmt->pb;
    if (pb && pb->error < 0) av_check(pb->error, where(m.path) + ": writing the file");
    m.fmt.reset();  // closes the file
  } catch (...) {
    m.failed = true;
    m.fmt.reset();
    m.out->discard();
    throw;
  }
}

void Mp4Writer::close() {
  if (!impl_) return;
  finish();
  Impl& m = *impl_;
  if (m.failed) throw wm::Error(where(m.path) + ": not written (finishing the file failed)");
  m.out->commit();  // throws naming both names; removes the temporary file then
}

Mp4Writer::~Mp4Writer() = default;

Mp4Writer::Mp4Writer(Mp4Writer&&) noexcept = default;
Mp4Writer& Mp4Writer::operator=(Mp4Writer&& other) noexcept = default;

int Mp4Writer::frames_written() const { return impl_ ? impl_->frames : 0; }
int Mp4Writer::out_width() const { return impl_ ? impl_->out_w : 0; }
int Mp4Writer::out_height() const { return impl_ ? impl_->out_h : 0; }
std::string Mp4Writer::encoder_name() const { return impl_ ? impl_->encoder : std::string(); }
std::string Mp4Writer::path() const { return impl_ ? impl_->path : std::string(); }
std::string Mp4Writer::temporary_path() const { return impl_ && impl_->out ? impl_->out->tmp() : std::string(); }

}  // namespace wm::media
