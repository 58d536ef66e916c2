// How much longer a time bound in a test may be in this build. Bounds in the suites catch hangs and
// quadratic blowups, not speed; sanitizer builds run several times slower, so they get more room.
#pragma once

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr int kTimeScale = 10;
#else
inline constexpr int kTimeScale = 1;
#endif
