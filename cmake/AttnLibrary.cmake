# attn_library(NAME [DOC text]): one layer of the library as its own static (or shared) library,
# libattn_NAME, with the alias attn::NAME that the build tree and find_package(attn) users both name.
# Every layer sees the public headers (include/) and, privately, the library's own sources (src/: the
# internal headers of the layers below it; nothing outside the library gets src/ on its include path),
# is optimised with ATTN_LIBRARY_OPT in every build type, takes the project's warnings, and is installed
# in an export set of its own (attn_NAME-targets.cmake), so that find_package(attn COMPONENTS core)
# needs none of the upper layers' dependencies. The list of layers is the global property
# ATTN_LIBRARY_TARGETS (the fuzz build instruments each one).
function(attn_library name)
  set(target attn_${name})
  add_library(${target})
  add_library(attn::${name} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${name})
  target_include_directories(${target}
    PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
    PRIVATE ${PROJECT_SOURCE_DIR}/src ${RANDOM123_INCLUDE_DIR})
  target_compile_options(${target} PRIVATE ${ATTN_LIBRARY_OPT})
  target_link_libraries(${target} PRIVATE $<BUILD_INTERFACE:attn_warnings>)
  set_property(GLOBAL APPEND PROPERTY ATTN_LIBRARY_TARGETS ${target})
  install(TARGETS ${target} EXPORT attn_${name}-targets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(EXPORT attn_${name}-targets NAMESPACE attn:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/attn)
endfunction()
