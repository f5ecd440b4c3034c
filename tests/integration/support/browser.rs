//! The headless browser the console tests look through ([`browser`]), and checks on its PNG
//! screenshots ([`Screenshot`]): enough to assert "this colour covers at least N pixels in
//! that part of the page" without comparing against golden images, which break on every
//! font or anti-aliasing change.

// The console tests each use a part of this API; not every build uses all of it.
#![allow(dead_code)]

use std::collections::HashSet;
use std::path::Path;
use std::sync::OnceLock;

use raypipe::devenv::browser::Browser;

/// The machine's headless Chromium, found (or installed with apt, as root) once per test
/// binary. Panics with the reason (naming the package and `RAYPIPE_CHROMIUM`) when there is
/// none; a failed lookup is remembered so the other tests fail fast with the same message.
pub fn browser() -> Browser {
    static BROWSER: OnceLock<Result<Browser, String>> = OnceLock::new();
    match BROWSER.get_or_init(|| Browser::find_or_install().map_err(|e| e.to_string())) {
        Ok(browser) => browser.clone(),
        Err(e) => panic!("no browser for the console tests: {e}"),
    }
}

/// A decoded screenshot: 8-bit RGBA, row by row from the top left.
#[derive(Clone, Debug)]
pub struct Screenshot {
    pub width: u32,
    pub height: u32,
    pub rgba: Vec<u8>,
}

/// A rectangle of pixels: x, y of its top-left corner, width, height.
pub type Region = (u32, u32, u32, u32);

impl Screenshot {
    /// Decodes the PNG at `path` into 8-bit RGBA.
    pub fn read(path: &Path) -> Screenshot {
        let bytes = std::fs::read(path)
            .unwrap_or_else(|e| panic!("read the screenshot {}: {e}", path.display()));
        let image = raypipe::devenv::png::decode(&bytes)
            .unwrap_or_else(|e| panic!("decode {}: {e}", path.display()));
        Screenshot {
            width: image.width,
            height: image.height,
            rgba: image.rgba,
        }
    }

    /// The RGBA value at (`x`, `y`).
    pub fn pixel(&self, x: u32, y: u32) -> [u8; 4] {
        assert!(
            x < self.width && y < self.height,
            "({x}, {y}) is off the image"
        );
        let at = (y as usize * self.width as usize + x as usize) * 4;
        [
            self.rgba[at],
            self.rgba[at + 1],
            self.rgba[at + 2],
            self.rgba[at + 3],
        ]
    }

    /// How many pixels in `region` (the whole image when `None`; clipped to the image) have
    /// each of R, G and B within `tolerance` of `rgb`. Anti-aliased edges blend colours, so a
    /// test asks for a count, not for every pixel of a shape.
    pub fn count_pixels_near(&self, rgb: [u8; 3], tolerance: u8, region: Option<Region>) -> usize {
        let (x0, y0, w, h) = region.unwrap_or((0, 0, self.width, self.height));
        let x1 = x0.saturating_add(w).min(self.width);
        let y1 = y0.saturating_add(h).min(self.height);
        (y0.min(y1)..y1)
            .flat_map(|y| (x0.min(x1)..x1).map(move |x| (x, y)))
            .filter(|&(x, y)| {
                let p = self.pixel(x, y);
                p.iter()
                    .zip(rgb)
                    .all(|(&have, want)| have.abs_diff(want) <= tolerance)
            })
            .count()
    }

    /// How many different RGBA values the image has.
    pub fn distinct_colours(&self) -> usize {
        self.rgba
            .chunks_exact(4)
            .map(|p| [p[0], p[1], p[2], p[3]])
            .collect::<HashSet<_>>()
            .len()
    }

    /// One colour everywhere: nothing was drawn (a blank page, an error before render).
    pub fn is_blank(&self) -> bool {
        self.distinct_colours() <= 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes a `width`×`height` RGB PNG filled by `colour(x, y)`.
    fn write_png(path: &Path, width: u32, height: u32, colour: impl Fn(u32, u32) -> [u8; 3]) {
        let data: Vec<u8> = (0..height)
            .flat_map(|y| (0..width).map(move |x| (x, y)))
            .flat_map(|(x, y)| colour(x, y))
            .collect();
        std::fs::write(path, raypipe::devenv::png::encode_rgb(width, height, &data))
            .expect("write the PNG");
    }

    #[test]
    fn screenshots_are_counted_by_colour_and_region() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("shot.png");
        // A 10×10 green square at the top left of a 20×20 white image, one off-green pixel.
        write_png(&path, 20, 20, |x, y| match (x, y) {
            (0, 0) => [0x30, 0x7f, 0x30],
            (x, y) if x < 10 && y < 10 => [0x2e, 0x7d, 0x32],
            _ => [255, 255, 255],
        });
        let shot = Screenshot::read(&path);
        assert_eq!((shot.width, shot.height), (20, 20));
        assert_eq!(shot.pixel(5, 5), [0x2e, 0x7d, 0x32, 255]);
        let green = [0x2e, 0x7d, 0x32];
        assert_eq!(shot.count_pixels_near(green, 0, None), 99);
        assert_eq!(shot.count_pixels_near(green, 2, None), 100);
        assert_eq!(shot.count_pixels_near(green, 2, Some((0, 10, 20, 10))), 0);
        assert_eq!(shot.count_pixels_near(green, 2, Some((5, 5, 100, 100))), 25);
        assert_eq!(shot.distinct_colours(), 3);
        assert!(!shot.is_blank());

        write_png(&path, 4, 4, |_, _| [255, 255, 255]);
        assert!(Screenshot::read(&path).is_blank());
    }
}
