# Included at a CMake-built component's first project() (CMAKE_PROJECT_TOP_LEVEL_INCLUDES, set by the
# toolchain file the tool writes): a FetchContent_MakeAvailable of an input the lock does not name
# fails the configure with one line naming it (the build is offline: FETCHCONTENT_FULLY_DISCONNECTED=ON).
macro(builder_native_provider method name)
  string(TOLOWER "${name}" _builder_name)
  if(NOT _builder_name IN_LIST BUILDER_NATIVE_INPUTS)
    message(FATAL_ERROR "builder: native input '${name}' is not in the lock (FetchContent_MakeAvailable in an offline build; declare it where `builder lock` reads: the root CMakeLists.txt or a .cmake file it include()s)")
  endif()
endmacro()
cmake_language(SET_DEPENDENCY_PROVIDER builder_native_provider SUPPORTED_METHODS FETCHCONTENT_MAKEAVAILABLE_SERIAL)
