# Embeds text files in the binary: q4t_embed_files(TARGET <lib> FILES a.toml b.jsonl ...) writes
# <build>/embedded/embedded_files.cpp defining q4t::embedded_file(name) over the files' bytes (see
# train/embedded.h), regenerated when a file changes.
function(q4t_embed_files)
  cmake_parse_arguments(ARG "" "TARGET" "FILES" ${ARGN})
  set(out ${CMAKE_CURRENT_BINARY_DIR}/embedded/embedded_files.cpp)
  set(abs_files)
  foreach(f ${ARG_FILES})
    get_filename_component(abs ${f} ABSOLUTE)
    list(APPEND abs_files ${abs})
  endforeach()
  add_custom_command(
    OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -DOUT=${out} "-DFILES=${abs_files}" -P ${PROJECT_SOURCE_DIR}/cmake/EmbedWrite.cmake
    DEPENDS ${abs_files} ${PROJECT_SOURCE_DIR}/cmake/EmbedWrite.cmake
    COMMENT "embedding ${ARG_FILES}"
    VERBATIM)
  target_sources(${ARG_TARGET} PRIVATE ${out})
endfunction()
