// <immintrin.h> for a file with AVX-512 code, included before anything else includes it. GCC 12
// warns that the AVX-512 intrinsics' own _mm512_undefined_* placeholders are used uninitialized
// (GCC bug 105593, fixed in GCC 13) wherever they are inlined; a diagnostic pragma applies to the
// text it encloses, so it must enclose the header's first inclusion in the file.
#pragma once

#if defined(DRAFTFEED_X86) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#elif defined(DRAFTFEED_X86)
#include <immintrin.h>
#endif
