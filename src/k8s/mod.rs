//! See DESIGN.md: filled in by later work.
