//! Just enough PNG for the browser tests: decoding Chromium's screenshots (8-bit grey, grey
//! with alpha, RGB or RGBA, not interlaced) into RGBA, and writing RGB images for the tests
//! of the checks themselves. Built on the flate2 the tree already has, so no image crate (and
//! no second miniz_oxide) joins the build for a test-only need.

use std::io::{Read as _, Write as _};

const SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n'];
/// Screenshots far larger than any test takes are refused rather than inflated.
const MAX_PIXELS: u64 = 64 * 1024 * 1024;

/// A decoded image: 8-bit RGBA, row by row from the top left.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Image {
    pub width: u32,
    pub height: u32,
    pub rgba: Vec<u8>,
}

fn be32(bytes: &[u8]) -> u32 {
    u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

fn paeth(a: u8, b: u8, c: u8) -> u8 {
    let (ia, ib, ic) = (i16::from(a), i16::from(b), i16::from(c));
    let p = ia + ib - ic;
    let (pa, pb, pc) = ((p - ia).abs(), (p - ib).abs(), (p - ic).abs());
    if pa <= pb && pa <= pc {
        a
    } else if pb <= pc {
        b
    } else {
        c
    }
}

/// Decodes `bytes`; the error says what is not supported or broken.
pub fn decode(bytes: &[u8]) -> Result<Image, String> {
    if bytes.len() < 8 || bytes[..8] != SIGNATURE {
        return Err("not a PNG (bad signature)".into());
    }
    let mut at = 8;
    let mut header = None;
    let mut compressed = Vec::new();
    while at + 8 <= bytes.len() {
        let length = be32(&bytes[at..]) as usize;
        let kind = &bytes[at + 4..at + 8];
        let data = bytes
            .get(at + 8..at + 8 + length)
            .ok_or("a chunk runs past the end")?;
        match kind {
            b"IHDR" if data.len() == 13 => header = Some(data.to_vec()),
            b"IDAT" => compressed.extend_from_slice(data),
            b"IEND" => break,
            _ => {}
        }
        at += 12 + length;
    }
    let header = header.ok_or("no IHDR chunk")?;
    let (width, height) = (be32(&header[0..]), be32(&header[4..]));
    let (depth, colour, interlace) = (header[8], header[9], header[12]);
    let channels: usize = match colour {
        0 => 1,
        2 => 3,
        4 => 2,
        6 => 4,
        other => return Err(format!("colour type {other} is not supported")),
    };
    if depth != 8 || interlace != 0 {
        return Err(format!(
            "only 8-bit, non-interlaced images (bit depth {depth}, interlace {interlace})"
        ));
    }
    if u64::from(width) * u64::from(height) > MAX_PIXELS || width == 0 || height == 0 {
        return Err(format!("{width}x{height} pixels is out of range"));
    }
    let stride = width as usize * channels;
    let mut raw = Vec::with_capacity((stride + 1) * height as usize);
    flate2::read::ZlibDecoder::new(&compressed[..])
        .take(((stride + 1) * height as usize) as u64)
        .read_to_end(&mut raw)
        .map_err(|e| format!("inflating the image data: {e}"))?;
    if raw.len() != (stride + 1) * height as usize {
        return Err("the image data is shorter than its size".into());
    }
    let mut pixels = vec![0u8; stride * height as usize];
    for y in 0..height as usize {
        let filter = raw[y * (stride + 1)];
        let line = &raw[y * (stride + 1) + 1..(y + 1) * (stride + 1)];
        for x in 0..stride {
            let left = if x >= channels {
                pixels[y * stride + x - channels]
            } else {
                0
            };
            let up = if y > 0 {
                pixels[(y - 1) * stride + x]
            } else {
                0
            };
            let up_left = if y > 0 && x >= channels {
                pixels[(y - 1) * stride + x - channels]
            } else {
                0
            };
            let predicted = match filter {
                0 => 0,
                1 => left,
                2 => up,
                3 => ((u16::from(left) + u16::from(up)) / 2) as u8,
                4 => paeth(left, up, up_left),
                other => return Err(format!("filter type {other} on row {y}")),
            };
            pixels[y * stride + x] = line[x].wrapping_add(predicted);
        }
    }
    let rgba = match channels {
        4 => pixels,
        3 => pixels
            .chunks_exact(3)
            .flat_map(|p| [p[0], p[1], p[2], 255])
            .collect(),
        2 => pixels
            .chunks_exact(2)
            .flat_map(|p| [p[0], p[0], p[0], p[1]])
            .collect(),
        _ => pixels.iter().flat_map(|&g| [g, g, g, 255]).collect(),
    };
    Ok(Image {
        width,
        height,
        rgba,
    })
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let start = out.len();
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let crc = crc32(&out[start..]);
    out.extend_from_slice(&crc.to_be_bytes());
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// An 8-bit RGB PNG of `width`×`height` from `rgb` (3 bytes a pixel, row by row).
pub fn encode_rgb(width: u32, height: u32, rgb: &[u8]) -> Vec<u8> {
    let stride = width as usize * 3;
    let mut raw = Vec::with_capacity((stride + 1) * height as usize);
    for row in rgb.chunks_exact(stride) {
        raw.push(0);
        raw.extend_from_slice(row);
    }
    let mut zlib = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
    // Writing to a Vec cannot fail.
    let _ = zlib.write_all(&raw);
    let compressed = zlib.finish().unwrap_or_default();
    let mut header = Vec::with_capacity(13);
    header.extend_from_slice(&width.to_be_bytes());
    header.extend_from_slice(&height.to_be_bytes());
    header.extend_from_slice(&[8, 2, 0, 0, 0]);
    let mut out = SIGNATURE.to_vec();
    chunk(&mut out, b"IHDR", &header);
    chunk(&mut out, b"IDAT", &compressed);
    chunk(&mut out, b"IEND", &[]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_encoded_image_decodes_to_the_same_pixels() {
        let (w, h) = (7u32, 5u32);
        let rgb: Vec<u8> = (0..w * h * 3).map(|i| (i * 37 % 251) as u8).collect();
        let image = decode(&encode_rgb(w, h, &rgb)).expect("decodes");
        assert_eq!((image.width, image.height), (w, h));
        let back: Vec<u8> = image
            .rgba
            .chunks_exact(4)
            .flat_map(|p| [p[0], p[1], p[2]])
            .collect();
        assert_eq!(back, rgb);
        assert!(image.rgba.chunks_exact(4).all(|p| p[3] == 255));
        // The standard check value of CRC-32.
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
    }

    #[test]
    fn broken_images_are_errors_not_panics() {
        assert!(decode(b"").is_err());
        assert!(decode(b"GIF89a").is_err());
        let good = encode_rgb(2, 2, &[0; 12]);
        for cut in [9, 20, 33, 45] {
            assert!(decode(&good[..cut]).is_err(), "cut at {cut}");
        }
    }
}
