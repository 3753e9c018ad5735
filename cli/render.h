/* nalar render: a chat template rendered over a conversation (cli/render.c) */
#ifndef NALAR_CLI_RENDER_H
#define NALAR_CLI_RENDER_H

int nalar_cmd_render(int argc, char **argv);

#endif
