// Words of 2-byte aligned data (Q4_0's, Q5_0's, Q3_K's and IQ4_NL's blocks), read as aligned 32-bit words.
#ifndef Q4T_WORDS_GLSL
#define Q4T_WORDS_GLSL
// The word at byte 2 of the two words a, b (b's low half above a's high half).
uint mid_word(uint a, uint b) { return (a >> 16u) | (b << 16u); }
#endif
