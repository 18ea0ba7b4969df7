// stb_image's implementation, compiled here only where no stb library was found (a machine
// without Debian's libstb-dev: Note [A build without Debian's packages] in CMakeLists.txt).
#if NMCMC_STB_IMPLEMENTATION
#define STB_IMAGE_IMPLEMENTATION
#include <stb/stb_image.h>
#endif
