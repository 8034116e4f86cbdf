#include <stdio.h>

int main(int argc, char **argv) {
    FILE *f = fopen(argv[1], "rb");
    unsigned long total = 0
    int c;
    while ((c = fgetc(f)) != EOF) total += (unsigned char)c;
    printf("%lu\n", total);
    return 0;
}
