#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    char line[256], word[128];
    FILE *f = argc > 1 ? fopen(argv[1], "r") : NULL;
    if (!f) return 2;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "greeting = %127s", word) == 1) {
            printf("%s\n", word);
            fclose(f);
            return 0;
        }
    }
    fclose(f);
    return 1;
}
