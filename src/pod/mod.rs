//! Pod-level pieces: CRI config decoding/validation and pod files.
