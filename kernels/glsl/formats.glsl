// The codes of the frozen weight formats, shared by the shaders and the C++ table (kernels/formats.h includes this
// file): GGML's type numbers. A shader built for one format gets FORMAT defined to one of these by its variant
// (kernels/CMakeLists.txt); nothing else spells a format as a number.
#define FORMAT_F32 0  // f32 tables (embedding_forward.comp, linear_ce_*.comp): no unit format
#define FORMAT_F16 1
#define FORMAT_Q4_0 2
#define FORMAT_Q4_1 3
#define FORMAT_Q5_0 6
#define FORMAT_Q5_1 7
#define FORMAT_Q8_0 8
#define FORMAT_Q2_K 10
#define FORMAT_Q3_K 11
#define FORMAT_Q4_K 12
#define FORMAT_Q5_K 13
#define FORMAT_Q6_K 14
#define FORMAT_IQ4_NL 20
#define FORMAT_IQ4_XS 23
#define FORMAT_BF16 30
