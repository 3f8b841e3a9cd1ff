// JPEG (TurboJPEG), PNG (libpng), TIFF (libtiff), BMP (gdk-pixbuf) codecs and resizing, in RAII.
#include "dp/image_io.hpp"

#include <gdk-pixbuf/gdk-pixbuf.h>
#include <png.h>
#include <sys/stat.h>
#include <tiffio.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>

#include "dp/error.hpp"

namespace dp::data {

namespace {

constexpr size_t kSignatureBytes = 8;  // enough for both signatures below
constexpr uint8_t kJpegSignature[] = {0xFF, 0xD8, 0xFF};
constexpr uint8_t kPngSignature[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
constexpr uint8_t kTiffLittleSignature[] = {'I', 'I', 42, 0};
constexpr uint8_t kTiffBigSignature[] = {'M', 'M', 0, 42};
constexpr uint8_t kBmpSignature[] = {'B', 'M'};
constexpr int kMaxJpegQuality = 100;
constexpr uint8_t kOpaque = 255;
constexpr int kRgbaChannels = 4;

// ---------------------------------------------------------------------------------------------
// RAII owners of the C handles

struct FileCloser {
  void operator()(std::FILE* f) const noexcept { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

struct TjDestroyer {
  void operator()(void* handle) const noexcept { tjDestroy(handle); }
};
using TjHandle = std::unique_ptr<void, TjDestroyer>;  // tjhandle is a void*

struct TjFreer {
  void operator()(unsigned char* buffer) const noexcept { tjFree(buffer); }
};
using TjBuffer = std::unique_ptr<unsigned char, TjFreer>;

// libpng's simplified-API control structure; png_image_free releases whatever it holds.
class PngImage {
 public:
  PngImage() {
    std::memset(&image_, 0, sizeof image_);
    image_.version = PNG_IMAGE_VERSION;
  }
  ~PngImage() { png_image_free(&image_); }
  PngImage(const PngImage&) = delete;
  PngImage& operator=(const PngImage&) = delete;
  png_image* get() { return &image_; }
  png_image* operator->() { return &image_; }

 private:
  png_image image_;
};

// ---------------------------------------------------------------------------------------------
// Files

std::vector<uint8_t> read_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    fail("cannot read image '", path, "': ", std::strerror(errno));
  DP_CHECK(S_ISREG(st.st_mode), "cannot read image '", path, "': not a regular file");
  FilePtr f(std::fopen(path.c_str(), "rb"));
  if (!f) fail("cannot read image '", path, "': ", std::strerror(errno));
  std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size));
  const size_t got = std::fread(bytes.data(), 1, bytes.size(), f.get());
  if (got != bytes.size()) {
    fail("cannot read image '", path,
         "': ", std::ferror(f.get()) ? std::strerror(errno) : "file shrank while reading");
  }
  DP_CHECK(!bytes.empty(), "image '", path, "' is empty (0 bytes)");
  return bytes;
}

void write_file(const std::string& path, const void* data, size_t size) {
  FilePtr f(std::fopen(path.c_str(), "wb"));
  if (!f) fail("cannot write image '", path, "': ", std::strerror(errno));
  if (std::fwrite(data, 1, size, f.get()) != size || std::fflush(f.get()) != 0) {
    fail("cannot write image '", path, "': ", std::strerror(errno));
  }
  std::FILE* raw = f.release();
  if (std::fclose(raw) != 0) fail("cannot write image '", path, "': ", std::strerror(errno));
}

template <size_t N>
bool starts_with(const std::vector<uint8_t>& bytes, const uint8_t (&signature)[N]) {
  return bytes.size() >= N && std::equal(signature, signature + N, bytes.begin());
}

enum class Codec { kJpeg, kPng, kTiff, kBmp };

Codec detect(const std::vector<uint8_t>& bytes, const std::string& path) {
  if (starts_with(bytes, kJpegSignature)) return Codec::kJpeg;
  if (starts_with(bytes, kPngSignature)) return Codec::kPng;
  if (starts_with(bytes, kTiffLittleSignature) || starts_with(bytes, kTiffBigSignature))
    return Codec::kTiff;
  if (starts_with(bytes, kBmpSignature)) return Codec::kBmp;
  std::string head;
  for (size_t i = 0; i < std::min(bytes.size(), kSignatureBytes); ++i) {
    constexpr const char* kHex = "0123456789abcdef";
    head += str_cat(i ? " " : "", kHex[bytes[i] >> 4], kHex[bytes[i] & 15]);
  }
  fail("image '", path, "' is neither JPEG nor PNG, TIFF or BMP (it starts with bytes ", head, ")");
}

void check_size(int width, int height, const std::string& path) {
  DP_CHECK(width > 0 && height > 0 && width <= kMaxImageSide && height <= kMaxImageSide, "image '",
           path, "' has size ", width, "x", height, ", expected sides in [1, ", kMaxImageSide, "]");
}

// Pixels a file may claim before they are allocated: any count up to kFreePixels, beyond that at
// most `per_byte` per byte of the file. JPEG: a Huffman-coded 8x8 block takes at least a bit
// (512 px/byte), with room for arithmetic coding; PNG: 1-bit pixels at deflate's largest ratio.
constexpr int64_t kFreePixels = int64_t{1} << 24;
constexpr int64_t kJpegPixelsPerByte = 4096;
constexpr int64_t kPngPixelsPerByte = 8 * 1032;

void check_claim(int width, int height, size_t bytes, int64_t per_byte, const char* codec,
                 const std::string& path) {
  const int64_t pixels = static_cast<int64_t>(width) * height;
  DP_CHECK(pixels <= std::max(kFreePixels, static_cast<int64_t>(bytes) * per_byte), codec, " '",
           path, "' claims ", width, "x", height, " pixels in a file of ", bytes,
           " bytes: it is truncated or forged");
}

// ---------------------------------------------------------------------------------------------
// JPEG

TjHandle jpeg_decompressor(const std::string& path) {
  TjHandle handle(tjInitDecompress());
  DP_CHECK(handle, "decoding '", path, "': TurboJPEG: ", tjGetErrorStr2(nullptr));
  return handle;
}

struct JpegHeader {
  int width = 0, height = 0, subsampling = 0, colorspace = 0;
};

JpegHeader jpeg_header(void* handle, const std::vector<uint8_t>& bytes, const std::string& path) {
  JpegHeader h;
  if (tjDecompressHeader3(handle, bytes.data(), bytes.size(), &h.width, &h.height, &h.subsampling,
                          &h.colorspace) != 0) {
    fail("corrupt JPEG '", path, "': ", tjGetErrorStr2(handle));
  }
  DP_CHECK(h.colorspace != TJCS_CMYK && h.colorspace != TJCS_YCCK, "JPEG '", path,
           "' is CMYK, which is not supported: convert it to RGB");
  check_size(h.width, h.height, path);
  check_claim(h.width, h.height, bytes.size(), kJpegPixelsPerByte, "JPEG", path);
  return h;
}

Image decode_jpeg(const std::vector<uint8_t>& bytes, const std::string& path, PixelFormat format) {
  TjHandle handle = jpeg_decompressor(path);
  const JpegHeader h = jpeg_header(handle.get(), bytes, path);
  Image img;
  img.width = h.width;
  img.height = h.height;
  img.channels = static_cast<int>(format);
  img.pixels.resize(static_cast<size_t>(h.width) * h.height * img.channels);
  const int pixel_format = format == PixelFormat::kRgb ? TJPF_RGB : TJPF_GRAY;
  // Any libjpeg warning ("Premature end of JPEG file", "Corrupt JPEG data: ...") is an error:
  // the pixels after it are made up by the decoder.
  const int flags = TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS;
  if (tjDecompress2(handle.get(), bytes.data(), bytes.size(), img.pixels.data(), h.width, 0,
                    h.height, pixel_format, flags) != 0) {
    const bool warning = tjGetErrorCode(handle.get()) == TJERR_WARNING;
    fail(warning ? "corrupt or truncated JPEG '" : "cannot decode JPEG '", path,
         "': ", tjGetErrorStr2(handle.get()));
  }
  return img;
}

// ---------------------------------------------------------------------------------------------
// PNG

void png_begin(PngImage& png, const std::vector<uint8_t>& bytes, const std::string& path) {
  if (!png_image_begin_read_from_memory(png.get(), bytes.data(), bytes.size())) {
    fail("corrupt PNG '", path, "': libpng: ", png->message);
  }
  check_size(static_cast<int>(std::min<png_uint_32>(png->width, kMaxImageSide + 1)),
             static_cast<int>(std::min<png_uint_32>(png->height, kMaxImageSide + 1)), path);
  check_claim(static_cast<int>(png->width), static_cast<int>(png->height), bytes.size(),
              kPngPixelsPerByte, "PNG", path);
}

Image decode_png(const std::vector<uint8_t>& bytes, const std::string& path, PixelFormat format) {
  PngImage png;
  png_begin(png, bytes, path);
  const bool alpha = (png->format & PNG_FORMAT_FLAG_ALPHA) != 0;
  // 16-bit files without gamma information are sRGB like 8-bit ones (libpng assumes linear).
  png->flags |= PNG_IMAGE_FLAG_16BIT_sRGB;
  png->format = (format == PixelFormat::kRgb ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY) |
                (alpha ? PNG_FORMAT_FLAG_ALPHA : 0u);
  const int stored = static_cast<int>(PNG_IMAGE_PIXEL_CHANNELS(png->format));
  Image img;
  img.width = static_cast<int>(png->width);
  img.height = static_cast<int>(png->height);
  img.channels = static_cast<int>(format);
  std::vector<uint8_t> buffer(PNG_IMAGE_SIZE(*png.get()));
  if (!png_image_finish_read(png.get(), nullptr, buffer.data(), 0, nullptr)) {
    fail("corrupt or truncated PNG '", path, "': libpng: ", png->message);
  }
  if (!alpha) {
    img.pixels = std::move(buffer);
    return img;
  }
  const size_t pixels = static_cast<size_t>(img.width) * img.height;
  img.pixels.resize(pixels * img.channels);
  for (size_t i = 0; i < pixels; ++i) {
    const uint8_t* src = &buffer[i * stored];
    DP_CHECK(src[stored - 1] == kOpaque, "PNG '", path, "' has transparent pixels (the first at x ",
             i % img.width, ", y ", i / img.width,
             "): flatten it onto a background first; only fully opaque alpha channels are dropped");
    std::copy(src, src + img.channels, &img.pixels[i * img.channels]);
  }
  return img;
}

// ---------------------------------------------------------------------------------------------
// TIFF (libtiff, read from memory through TIFFClientOpen) and BMP (gdk-pixbuf's loader)

// The bytes a TIFF handle reads, and libtiff's last error for this thread (libtiff reports
// errors through a process-wide handler).
struct TiffSource {
  const std::vector<uint8_t>* bytes = nullptr;
  toff_t at = 0;
};
thread_local std::string tiff_error;

void tiff_error_handler(const char* module, const char* fmt, va_list args) {
  char text[512];
  std::vsnprintf(text, sizeof text, fmt, args);
  tiff_error = module ? str_cat(module, ": ", text) : std::string(text);
}

tmsize_t tiff_read(thandle_t h, void* dst, tmsize_t size) {
  auto* src = static_cast<TiffSource*>(h);
  const toff_t left = src->at < src->bytes->size() ? src->bytes->size() - src->at : 0;
  const auto n = static_cast<size_t>(std::min<toff_t>(left, static_cast<toff_t>(size)));
  std::memcpy(dst, src->bytes->data() + src->at, n);
  src->at += n;
  return static_cast<tmsize_t>(n);
}
tmsize_t tiff_write(thandle_t, void*, tmsize_t) {
  return -1;
}
toff_t tiff_seek(thandle_t h, toff_t offset, int whence) {
  auto* src = static_cast<TiffSource*>(h);
  const toff_t base = whence == SEEK_CUR ? src->at : whence == SEEK_END ? src->bytes->size() : 0;
  src->at = base + offset;
  return src->at;
}
int tiff_close(thandle_t) {
  return 0;
}
toff_t tiff_size(thandle_t h) {
  return static_cast<TiffSource*>(h)->bytes->size();
}
int tiff_map(thandle_t, void**, toff_t*) {
  return 0;
}
void tiff_unmap(thandle_t, void*, toff_t) {}

struct TiffCloser {
  void operator()(TIFF* t) const noexcept { TIFFClose(t); }
};
using TiffPtr = std::unique_ptr<TIFF, TiffCloser>;

// A TIFF written to memory: libtiff writes, seeks and reads back (its directory) through these.
struct TiffSink {
  std::vector<uint8_t> bytes;
  toff_t at = 0;
};
tmsize_t sink_read(thandle_t h, void* dst, tmsize_t size) {
  auto* sink = static_cast<TiffSink*>(h);
  const toff_t left = sink->at < sink->bytes.size() ? sink->bytes.size() - sink->at : 0;
  const auto n = static_cast<size_t>(std::min<toff_t>(left, static_cast<toff_t>(size)));
  std::memcpy(dst, sink->bytes.data() + sink->at, n);
  sink->at += n;
  return static_cast<tmsize_t>(n);
}
tmsize_t sink_write(thandle_t h, void* src, tmsize_t size) {
  auto* sink = static_cast<TiffSink*>(h);
  const size_t n = static_cast<size_t>(size);
  if (sink->bytes.size() < sink->at + n) sink->bytes.resize(sink->at + n);
  std::memcpy(sink->bytes.data() + sink->at, src, n);
  sink->at += n;
  return size;
}
toff_t sink_seek(thandle_t h, toff_t offset, int whence) {
  auto* sink = static_cast<TiffSink*>(h);
  const toff_t base = whence == SEEK_CUR ? sink->at : whence == SEEK_END ? sink->bytes.size() : 0;
  sink->at = base + offset;
  return sink->at;
}
toff_t sink_size(thandle_t h) {
  return static_cast<TiffSink*>(h)->bytes.size();
}

// Opens a TIFF from memory and reads the size of its first image.
// libtiff's errors into tiff_error, its warnings nowhere (once per process).
void install_tiff_handlers() {
  static std::once_flag handlers;
  std::call_once(handlers, [] {
    TIFFSetErrorHandler(tiff_error_handler);
    TIFFSetWarningHandler(nullptr);  // unknown tags and the like: not a reason to fail
  });
}

TiffPtr tiff_open(TiffSource& src, const std::string& path, int& width, int& height) {
  install_tiff_handlers();
  tiff_error.clear();
  TiffPtr tif(TIFFClientOpen(path.c_str(), "rm", &src, tiff_read, tiff_write, tiff_seek, tiff_close,
                             tiff_size, tiff_map, tiff_unmap));
  if (!tif) fail("corrupt TIFF '", path, "': libtiff: ", tiff_error);
  uint32_t w = 0, h = 0;
  if (!TIFFGetField(tif.get(), TIFFTAG_IMAGEWIDTH, &w) ||
      !TIFFGetField(tif.get(), TIFFTAG_IMAGELENGTH, &h)) {
    fail("corrupt TIFF '", path, "': no image width or length");
  }
  check_size(static_cast<int>(std::min<uint32_t>(w, kMaxImageSide + 1)),
             static_cast<int>(std::min<uint32_t>(h, kMaxImageSide + 1)), path);
  width = static_cast<int>(w);
  height = static_cast<int>(h);
  check_claim(width, height, src.bytes->size(), kPngPixelsPerByte, "TIFF", path);
  return tif;
}

// RGBA pixels (4 bytes each, rows top to bottom) -> `format`, refusing transparency like PNG.
Image from_rgba(const uint8_t* rgba, int width, int height, size_t stride, int channels,
                PixelFormat format, const char* codec, const std::string& path) {
  Image img{width, height, static_cast<int>(format), {}};
  img.pixels.resize(static_cast<size_t>(width) * height * img.channels);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const uint8_t* p = rgba + static_cast<size_t>(y) * stride + static_cast<size_t>(x) * channels;
      DP_CHECK(channels < kRgbaChannels || p[3] == kOpaque, codec, " '", path,
               "' has transparent pixels (the first at x ", x, ", y ", y,
               "): flatten it onto a background first; only fully opaque alpha channels are "
               "dropped");
      uint8_t* d = &img.pixels[(static_cast<size_t>(y) * width + x) * img.channels];
      if (format == PixelFormat::kRgb) {
        d[0] = p[0], d[1] = p[1], d[2] = p[2];
      } else if (p[0] == p[1] && p[1] == p[2]) {
        d[0] = p[0];  // grey (1-bit and palette masks included): exact
      } else {
        d[0] = static_cast<uint8_t>(std::lround(0.299 * p[0] + 0.587 * p[1] + 0.114 * p[2]));
      }
    }
  }
  return img;
}

Image decode_tiff(const std::vector<uint8_t>& bytes, const std::string& path, PixelFormat format) {
  TiffSource src{&bytes, 0};
  int width = 0, height = 0;
  TiffPtr tif = tiff_open(src, path, width, height);
  std::vector<uint32_t> raster(static_cast<size_t>(width) * height);
  tiff_error.clear();
  if (!TIFFReadRGBAImageOriented(tif.get(), static_cast<uint32_t>(width),
                                 static_cast<uint32_t>(height), raster.data(), ORIENTATION_TOPLEFT,
                                 1) ||
      !tiff_error.empty()) {
    fail("corrupt or unsupported TIFF '", path, "': libtiff: ", tiff_error);
  }
  std::vector<uint8_t> rgba(raster.size() * kRgbaChannels);
  for (size_t i = 0; i < raster.size(); ++i) {
    rgba[i * 4 + 0] = static_cast<uint8_t>(TIFFGetR(raster[i]));
    rgba[i * 4 + 1] = static_cast<uint8_t>(TIFFGetG(raster[i]));
    rgba[i * 4 + 2] = static_cast<uint8_t>(TIFFGetB(raster[i]));
    rgba[i * 4 + 3] = static_cast<uint8_t>(TIFFGetA(raster[i]));
  }
  return from_rgba(rgba.data(), width, height, static_cast<size_t>(width) * kRgbaChannels,
                   kRgbaChannels, format, "TIFF", path);
}

struct GObjectUnref {
  void operator()(void* o) const noexcept { g_object_unref(o); }
};
using LoaderPtr = std::unique_ptr<GdkPixbufLoader, GObjectUnref>;

// The fields of a BMP's headers read before gdk-pixbuf sees the file (little-endian offsets).
constexpr size_t kBmpFileSizeAt = 2;      // bfSize: the whole file, 0 if the writer left it out
constexpr size_t kBmpDataOffsetAt = 10;   // bfOffBits: where the pixel rows start
constexpr size_t kBmpInfoSizeAt = 14;     // biSize: 12 (OS/2 core header) or >= 40
constexpr size_t kBmpWidthAt = 18;        // int32 (int16 in a core header)
constexpr size_t kBmpHeightAt = 22;       // int32, negative for top-down rows
constexpr size_t kBmpBitsAt = 28;         // biBitCount
constexpr size_t kBmpCompressionAt = 30;  // biCompression: 0 = BI_RGB (uncompressed)
constexpr size_t kBmpInfoHeaderBytes = 34;
constexpr uint32_t kBmpCoreHeader = 12;
// Pixels a BMP may claim per byte beyond kFreePixels: RLE's delta escapes skip up to 255x255
// pixels in 4 bytes.
constexpr int64_t kBmpPixelsPerByte = 16384;

uint32_t le32(const std::vector<uint8_t>& bytes, size_t at) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i) v |= uint32_t{bytes[at + i]} << (8 * i);
  return v;
}

// What a BMP's headers claim, checked before it is decoded: gdk-pixbuf allocates what they say
// and fills the missing rows of a truncated file without an error.
void check_bmp_claims(const std::vector<uint8_t>& bytes, const std::string& path) {
  DP_CHECK(bytes.size() >= kBmpInfoHeaderBytes, "truncated BMP '", path, "': ", bytes.size(),
           " bytes, less than its headers");
  const uint32_t declared = le32(bytes, kBmpFileSizeAt);
  DP_CHECK(declared <= bytes.size(), "corrupt or truncated BMP '", path, "': its header says ",
           declared, " bytes, the file has ", bytes.size());
  if (le32(bytes, kBmpInfoSizeAt) == kBmpCoreHeader) return;  // OS/2 1.x: 16-bit sizes, small
  const auto width = static_cast<int32_t>(le32(bytes, kBmpWidthAt));
  const auto height = static_cast<int32_t>(le32(bytes, kBmpHeightAt));
  const int64_t h = height < 0 ? -int64_t{height} : height;
  check_size(static_cast<int>(std::clamp<int64_t>(width, 0, kMaxImageSide + 1)),
             static_cast<int>(std::min<int64_t>(h, kMaxImageSide + 1)), path);
  check_claim(width, static_cast<int>(h), bytes.size(), kBmpPixelsPerByte, "BMP", path);
  const uint32_t bits = bytes[kBmpBitsAt] | uint32_t{bytes[kBmpBitsAt + 1]} << 8;
  if (le32(bytes, kBmpCompressionAt) != 0 || bits == 0) return;
  // Uncompressed rows are padded to 4 bytes: all of them must be in the file.
  const uint64_t stride = (static_cast<uint64_t>(width) * bits + 31) / 32 * 4;
  const uint64_t end = le32(bytes, kBmpDataOffsetAt) + stride * static_cast<uint64_t>(h);
  DP_CHECK(end <= bytes.size(), "corrupt or truncated BMP '", path, "': its ", width, "x", h,
           " pixels of ", bits, " bits end at byte ", end, ", the file has ", bytes.size());
}

Image decode_bmp(const std::vector<uint8_t>& bytes, const std::string& path, PixelFormat format) {
  check_bmp_claims(bytes, path);
  GError* error = nullptr;
  LoaderPtr loader(gdk_pixbuf_loader_new_with_type("bmp", &error));
  auto fail_with = [&](const char* what) {
    const std::string text = error ? error->message : "no message";
    if (error) g_error_free(error);
    fail(what, " '", path, "': gdk-pixbuf: ", text);
  };
  if (!loader) fail_with("cannot decode BMP");
  const bool wrote = gdk_pixbuf_loader_write(loader.get(), bytes.data(), bytes.size(), &error);
  const bool closed = gdk_pixbuf_loader_close(loader.get(), wrote ? &error : nullptr);
  if (!wrote || !closed) fail_with("corrupt or truncated BMP");
  GdkPixbuf* pixbuf = gdk_pixbuf_loader_get_pixbuf(loader.get());  // owned by the loader
  DP_CHECK(pixbuf != nullptr, "corrupt BMP '", path, "': gdk-pixbuf decoded no image");
  const int width = gdk_pixbuf_get_width(pixbuf), height = gdk_pixbuf_get_height(pixbuf);
  check_size(width, height, path);
  DP_CHECK(gdk_pixbuf_get_bits_per_sample(pixbuf) == 8 &&
               gdk_pixbuf_get_colorspace(pixbuf) == GDK_COLORSPACE_RGB,
           "unsupported BMP '", path, "': gdk-pixbuf gave no 8-bit RGB image");
  return from_rgba(gdk_pixbuf_read_pixels(pixbuf), width, height,
                   static_cast<size_t>(gdk_pixbuf_get_rowstride(pixbuf)),
                   gdk_pixbuf_get_n_channels(pixbuf), format, "BMP", path);
}

// The PNG file's bytes; `path` names the destination in messages.
std::vector<uint8_t> png_bytes(const std::string& path, const void* pixels, int width, int height,
                               int channels, bool sixteen_bit,
                               PngEffort effort = PngEffort::kDefault) {
  DP_CHECK(channels >= 1 && channels <= kRgbaChannels, "writing PNG '", path, "': ", channels,
           " channels, expected 1 to 4");
  check_size(width, height, path);
  PngImage png;
  png->width = static_cast<png_uint_32>(width);
  png->height = static_cast<png_uint_32>(height);
  static constexpr png_uint_32 kFormats[] = {PNG_FORMAT_GRAY, PNG_FORMAT_GA, PNG_FORMAT_RGB,
                                             PNG_FORMAT_RGBA};
  png->format = kFormats[channels - 1] | (sixteen_bit ? PNG_FORMAT_FLAG_LINEAR : 0u);
  if (effort == PngEffort::kFast) png->flags |= PNG_IMAGE_FLAG_FAST;
  // Encoded once into libpng's bound on the size (asking for the size first would compress twice).
  png_alloc_size_t size = PNG_IMAGE_PNG_SIZE_MAX(*png.get());
  std::vector<uint8_t> bytes(size);
  if (!png_image_write_to_memory(png.get(), bytes.data(), &size, 0, pixels, 0, nullptr)) {
    fail("encoding PNG '", path, "': libpng: ", png->message);
  }
  bytes.resize(size);
  return bytes;
}

void encode_png(const std::string& path, const void* pixels, int width, int height, int channels,
                bool sixteen_bit) {
  const std::vector<uint8_t> bytes = png_bytes(path, pixels, width, height, channels, sixteen_bit);
  write_file(path, bytes.data(), bytes.size());
}

// Bilinear sampling positions along one axis: source index pair and weight of the second.
struct Tap {
  int i0 = 0, i1 = 0;
  float w1 = 0;
};

std::vector<Tap> bilinear_taps(int src, int dst) {
  std::vector<Tap> taps(static_cast<size_t>(dst));
  const double scale = static_cast<double>(src) / dst;
  for (int d = 0; d < dst; ++d) {
    const double s = std::max(0.0, (d + 0.5) * scale - 0.5);
    const int i0 = std::min(static_cast<int>(s), src - 1);
    taps[static_cast<size_t>(d)] = {i0, std::min(i0 + 1, src - 1), static_cast<float>(s - i0)};
  }
  return taps;
}

void check_resize(const Image& src, int width, int height) {
  DP_CHECK(src.width > 0 && src.height > 0 && src.channels > 0 &&
               src.pixels.size() == static_cast<size_t>(src.width) * src.height * src.channels,
           "resize: malformed source image ", src.width, "x", src.height, "x", src.channels);
  DP_CHECK(width > 0 && height > 0 && width <= kMaxImageSide && height <= kMaxImageSide,
           "resize: bad target size ", width, "x", height);
}

}  // namespace

bool has_image_extension(const std::string& name) {
  const size_t dot = name.find_last_of('.');
  if (dot == std::string::npos || dot == 0) return false;
  std::string ext = name.substr(dot + 1);
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext == "jpg" || ext == "jpeg" || ext == "png" || ext == "tif" || ext == "tiff" ||
         ext == "bmp";
}

ImageHeader read_image_header(const std::string& path) {
  const std::vector<uint8_t> bytes = read_file(path);
  const Codec codec = detect(bytes, path);
  if (codec == Codec::kJpeg) {
    TjHandle handle = jpeg_decompressor(path);
    const JpegHeader h = jpeg_header(handle.get(), bytes, path);
    return {h.width, h.height, "JPEG"};
  }
  if (codec == Codec::kTiff) {
    TiffSource src{&bytes, 0};
    int width = 0, height = 0;
    tiff_open(src, path, width, height);
    return {width, height, "TIFF"};
  }
  if (codec == Codec::kBmp) {  // gdk-pixbuf reads no header alone: BMPs are decoded
    const Image img = decode_bmp(bytes, path, PixelFormat::kGray);
    return {img.width, img.height, "BMP"};
  }
  PngImage png;
  png_begin(png, bytes, path);
  return {static_cast<int>(png->width), static_cast<int>(png->height), "PNG"};
}

Image read_image(const std::string& path, PixelFormat format) {
  const std::vector<uint8_t> bytes = read_file(path);
  switch (detect(bytes, path)) {
    case Codec::kJpeg:
      return decode_jpeg(bytes, path, format);
    case Codec::kTiff:
      return decode_tiff(bytes, path, format);
    case Codec::kBmp:
      return decode_bmp(bytes, path, format);
    case Codec::kPng:
      break;
  }
  return decode_png(bytes, path, format);
}

void write_jpeg(const std::string& path, const uint8_t* pixels, int width, int height,
                PixelFormat format, int quality) {
  check_size(width, height, path);
  DP_CHECK(quality >= 1 && quality <= kMaxJpegQuality, "writing JPEG '", path, "': quality ",
           quality, " out of range [1, ", kMaxJpegQuality, "]");
  TjHandle handle(tjInitCompress());
  DP_CHECK(handle, "writing JPEG '", path, "': TurboJPEG: ", tjGetErrorStr2(nullptr));
  const bool rgb = format == PixelFormat::kRgb;
  unsigned char* raw = nullptr;
  unsigned long size = 0;
  const int status = tjCompress2(handle.get(), pixels, width, 0, height, rgb ? TJPF_RGB : TJPF_GRAY,
                                 &raw, &size, rgb ? TJSAMP_420 : TJSAMP_GRAY, quality, 0);
  TjBuffer jpeg(raw);  // owns whatever TurboJPEG allocated, also on failure
  if (status != 0) fail("writing JPEG '", path, "': TurboJPEG: ", tjGetErrorStr2(handle.get()));
  write_file(path, jpeg.get(), size);
}

void write_png(const std::string& path, const uint8_t* pixels, int width, int height,
               int channels) {
  encode_png(path, pixels, width, height, channels, false);
}

std::vector<uint8_t> encode_png(const uint8_t* pixels, int width, int height, int channels,
                                PngEffort effort) {
  return png_bytes("(in memory)", pixels, width, height, channels, false, effort);
}

std::vector<uint8_t> encode_png16(const uint16_t* pixels, int width, int height, int channels) {
  return png_bytes("(in memory)", pixels, width, height, channels, true);
}

void write_png16(const std::string& path, const uint16_t* pixels, int width, int height,
                 int channels) {
  encode_png(path, pixels, width, height, channels, true);
}

std::vector<uint8_t> encode_tiff_float(const float* values, int width, int height) {
  check_size(width, height, "(in memory)");
  install_tiff_handlers();
  tiff_error.clear();
  TiffSink sink;
  {
    TiffPtr tif(TIFFClientOpen("(in memory)", "w", &sink, sink_read, sink_write, sink_seek,
                               tiff_close, sink_size, tiff_map, tiff_unmap));
    if (!tif) fail("encoding TIFF: libtiff: ", tiff_error);
    TIFF* t = tif.get();
    constexpr uint16_t kFloatBits = 32, kFloatPredictor = 3;
    TIFFSetField(t, TIFFTAG_IMAGEWIDTH, uint32_t(width));
    TIFFSetField(t, TIFFTAG_IMAGELENGTH, uint32_t(height));
    TIFFSetField(t, TIFFTAG_SAMPLESPERPIXEL, uint16_t(1));
    TIFFSetField(t, TIFFTAG_BITSPERSAMPLE, kFloatBits);
    TIFFSetField(t, TIFFTAG_SAMPLEFORMAT, uint16_t(SAMPLEFORMAT_IEEEFP));
    TIFFSetField(t, TIFFTAG_PHOTOMETRIC, uint16_t(PHOTOMETRIC_MINISBLACK));
    TIFFSetField(t, TIFFTAG_PLANARCONFIG, uint16_t(PLANARCONFIG_CONTIG));
    TIFFSetField(t, TIFFTAG_COMPRESSION, uint16_t(COMPRESSION_ADOBE_DEFLATE));
    TIFFSetField(t, TIFFTAG_PREDICTOR, kFloatPredictor);
    TIFFSetField(t, TIFFTAG_ROWSPERSTRIP, TIFFDefaultStripSize(t, 0));
    std::vector<float> row(static_cast<size_t>(width));  // libtiff's predictor works in place
    for (int y = 0; y < height; ++y) {
      std::memcpy(row.data(), values + static_cast<size_t>(y) * width, row.size() * sizeof(float));
      if (TIFFWriteScanline(t, row.data(), uint32_t(y), 0) < 0)
        fail("encoding TIFF: libtiff: ", tiff_error);
    }
  }  // closed: the directory is written
  if (!tiff_error.empty()) fail("encoding TIFF: libtiff: ", tiff_error);
  return std::move(sink.bytes);
}

namespace {

// Bilinear resampling of `channels` interleaved channels (resize_bilinear's taps); 8-bit values
// are rounded and clamped, floats kept.
template <typename T>
void resample_bilinear(const T* src, int src_width, int src_height, int channels, T* dst, int width,
                       int height) {
  const std::vector<Tap> xs = bilinear_taps(src_width, width);
  const std::vector<Tap> ys = bilinear_taps(src_height, height);
  const int c = channels;
  for (int y = 0; y < height; ++y) {
    const Tap& ty = ys[static_cast<size_t>(y)];
    const T* r0 = &src[static_cast<size_t>(ty.i0) * src_width * c];
    const T* r1 = &src[static_cast<size_t>(ty.i1) * src_width * c];
    T* out = &dst[static_cast<size_t>(y) * width * c];
    for (int x = 0; x < width; ++x) {
      const Tap& tx = xs[static_cast<size_t>(x)];
      for (int k = 0; k < c; ++k) {
        const float a = r0[tx.i0 * c + k], b = r0[tx.i1 * c + k];
        const float d = r1[tx.i0 * c + k], e = r1[tx.i1 * c + k];
        const float top = a + tx.w1 * (b - a);
        const float bottom = d + tx.w1 * (e - d);
        const float v = top + ty.w1 * (bottom - top);
        if constexpr (std::is_same_v<T, uint8_t>)
          out[x * c + k] = static_cast<uint8_t>(std::clamp(std::lround(v), 0L, 255L));
        else
          out[x * c + k] = v;
      }
    }
  }
}

}  // namespace

Image resize_bilinear(const Image& src, int width, int height) {
  check_resize(src, width, height);
  Image dst{width, height, src.channels,
            std::vector<uint8_t>(static_cast<size_t>(width) * height * src.channels)};
  resample_bilinear(src.pixels.data(), src.width, src.height, src.channels, dst.pixels.data(),
                    width, height);
  return dst;
}

std::vector<float> resize_bilinear(const std::vector<float>& map, int src_width, int src_height,
                                   int width, int height) {
  DP_CHECK(
      src_width > 0 && src_height > 0 && map.size() == static_cast<size_t>(src_width) * src_height,
      "resize: malformed source map ", src_width, "x", src_height);
  DP_CHECK(width > 0 && height > 0 && width <= kMaxImageSide && height <= kMaxImageSide,
           "resize: bad target size ", width, "x", height);
  std::vector<float> dst(static_cast<size_t>(width) * height);
  resample_bilinear(map.data(), src_width, src_height, 1, dst.data(), width, height);
  return dst;
}

Image resize_nearest(const Image& src, int width, int height) {
  check_resize(src, width, height);
  const int c = src.channels;
  Image dst{width, height, c, std::vector<uint8_t>(static_cast<size_t>(width) * height * c)};
  // Source of destination index d: floor((d + 0.5) * src / dst), in integers.
  auto source = [](int d, int src_size, int dst_size) {
    return static_cast<int>((2 * static_cast<int64_t>(d) + 1) * src_size / (2 * dst_size));
  };
  for (int y = 0; y < height; ++y) {
    const int sy = source(y, src.height, height);
    for (int x = 0; x < width; ++x) {
      const int sx = source(x, src.width, width);
      std::copy_n(&src.pixels[(static_cast<size_t>(sy) * src.width + sx) * c], c,
                  &dst.pixels[(static_cast<size_t>(y) * width + x) * c]);
    }
  }
  return dst;
}

}  // namespace dp::data
