"""What lead speaks: OpenAI's, Anthropic's and llama.cpp's APIs, structured output, tools."""
