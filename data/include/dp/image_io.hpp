// Image files: JPEG, PNG, TIFF and BMP decoding (see read_image), encoding and resizing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dp::data {

// What a decoded image holds per pixel: kGray = 1 byte, kRgb = 3 bytes (R, G, B).
enum class PixelFormat { kGray = 1, kRgb = 3 };

// An 8-bit image, rows top to bottom, channels interleaved (HWC).
struct Image {
  int width = 0, height = 0, channels = 0;
  std::vector<uint8_t> pixels;  // height * width * channels
};

struct ImageHeader {
  int width = 0, height = 0;
  const char* codec = "";  // "JPEG", "PNG", "TIFF" or "BMP"
};

// Largest side accepted (px): larger images are refused before any allocation.
inline constexpr int kMaxImageSide = 32768;

// True for the file names dpprep reads: .jpg, .jpeg, .png, .tif, .tiff, .bmp in any letter case.
bool has_image_extension(const std::string& name);

// Reads the size of an image file without decoding its pixels. The codec is chosen by the file's
// first bytes, not its name. Throws dp::Error naming the file and the problem.
ImageHeader read_image_header(const std::string& path);

// Decodes a JPEG, PNG, TIFF (libtiff's RGBA interface: 1-bit, palette, 8/16-bit, any of its
// compressions; the first image of the file) or BMP (gdk-pixbuf: 1/4/8-bit palette, 16/24/32-bit)
// file into `format`; 1-bit and palette masks become 0/255 (grey values are kept exactly).
// Conversions: grayscale to RGB (replicated), RGB to gray (luma), palette to RGB, 16-bit to 8-bit;
// an alpha channel is dropped if every pixel is opaque and refused otherwise. Corrupt or truncated
// files (any JPEG or PNG decoder warning included) and unsupported ones (e.g. CMYK JPEG) throw
// dp::Error naming the file and the decoder's message.
Image read_image(const std::string& path, PixelFormat format);

// Writes `pixels` (height * width * channels of `format`) as a baseline JPEG (4:2:0 for RGB).
void write_jpeg(const std::string& path, const uint8_t* pixels, int width, int height,
                PixelFormat format, int quality);
// Writes an 8-bit PNG with 1 (gray), 2 (gray+alpha), 3 (RGB) or 4 (RGBA) channels.
void write_png(const std::string& path, const uint8_t* pixels, int width, int height, int channels);
// How hard an encoder works: kDefault is libpng's (zlib level 6, a filter chosen per row); kFast
// is its PNG_IMAGE_FLAG_FAST (no filters, a lower zlib level): for a binary mask of 3456x2304,
// 5x faster (21 against 109 ms) for 9% more bytes.
enum class PngEffort { kDefault, kFast };
// The bytes of an 8-bit PNG file (1-4 channels as write_png), e.g. for a data: URI.
std::vector<uint8_t> encode_png(const uint8_t* pixels, int width, int height, int channels,
                                PngEffort effort = PngEffort::kDefault);
// The bytes of a 16-bit PNG file (1-4 channels), as write_png16 writes them.
std::vector<uint8_t> encode_png16(const uint16_t* pixels, int width, int height, int channels);
// Writes a 16-bit PNG (1-4 channels as above). libpng's simplified API stores 16-bit data as
// linear light (gAMA 1.0), so reading it back to 8-bit sRGB keeps 0 and 65535 only.
void write_png16(const std::string& path, const uint16_t* pixels, int width, int height,
                 int channels);

// The bytes of a 32-bit floating-point gray TIFF (deflate with the floating-point predictor), e.g.
// probabilities at full precision.
std::vector<uint8_t> encode_tiff_float(const float* values, int width, int height);

// Resizes to width x height: bilinear (pixel centres aligned, as PyTorch's align_corners=False
// and OpenCV's INTER_LINEAR) for images, nearest (the source pixel whose area holds the
// destination pixel's centre) for masks, so a mask keeps exactly its original values.
Image resize_bilinear(const Image& src, int width, int height);
Image resize_nearest(const Image& src, int width, int height);
// A one-channel float map (src_width x src_height, row-major), bilinear as above: e.g. a
// probability map brought back to its photograph's size.
std::vector<float> resize_bilinear(const std::vector<float>& map, int src_width, int src_height,
                                   int width, int height);

}  // namespace dp::data
