# llama.cpp builds some twenty programs; llmgw runs three of them. `./dev` hands this file to
# llama.cpp's CMake (CMAKE_PROJECT_INCLUDE) so that its default build makes only those three and
# what they link: llama-server, llama-bench (`llmgw plan calibrate`) and ggml-rpc-server (replicas
# across nodes). The others stay defined, built only when asked for by name.
#
# It runs once the top-level CMakeLists.txt has added every target (a deferred call), and marks
# each program and library not kept EXCLUDE_FROM_ALL; what a kept program links is still built.

if(NOT CMAKE_CURRENT_SOURCE_DIR STREQUAL CMAKE_SOURCE_DIR)
  return() # a project() of a subdirectory (ggml's): the top-level one has deferred the call
endif()

set(LLMGW_KEEP llama-server llama-bench ggml-rpc-server)

function(llmgw_build_only_kept dir)
  get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
  foreach(target IN LISTS targets)
    get_target_property(type ${target} TYPE)
    if(type MATCHES "^(EXECUTABLE|STATIC_LIBRARY|SHARED_LIBRARY|MODULE_LIBRARY|OBJECT_LIBRARY)$"
       AND NOT target IN_LIST LLMGW_KEEP)
      set_property(TARGET ${target} PROPERTY EXCLUDE_FROM_ALL TRUE)
    endif()
  endforeach()
  get_property(subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    llmgw_build_only_kept("${sub}")
  endforeach()
endfunction()

cmake_language(DEFER CALL llmgw_build_only_kept "${CMAKE_SOURCE_DIR}")
