// The codes by which shaders name a frozen weight format (kernels/formats.h: Format, the same numbers). Shaders
// that read several formats test `p.format == FORMAT_Q8_0`, never a bare number; shaders built for one format
// get FORMAT defined to one of these by their variant (kernels/CMakeLists.txt).
#define FORMAT_Q4_0 1
#define FORMAT_Q8_0 2
#define FORMAT_F16 3
#define FORMAT_Q4_K 4
#define FORMAT_Q6_K 5
