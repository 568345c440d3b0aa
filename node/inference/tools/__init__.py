"""Tool calling: the formats templates speak, the prompt inputs, the grammar of a call, the parser.

  formats  detect_format(template), chat_format(template) (detect_format, where the template shows tools), prompt_inputs(), new_parser()
  forced   tool_grammar(): the grammar of a forced call, in each format's syntax
  parser   ToolCallParser: a reply's text in, content and OpenAI tool-call deltas out
  regions  how each format writes its calls (tagged: the formats that write the name outside JSON)
  jsonscan reading JSON that is still being written
"""

from node.inference.tools.forced import tool_grammar
from node.inference.tools.formats import (
    FORMATS,
    ToolFormat,
    chat_format,
    chat_template,
    detect_format,
    generic_reply,
    new_parser,
    prompt_inputs,
    thought_ends,
    tools_active,
)
from node.inference.tools.jsonscan import partial_object, unfinished_object
from node.inference.tools.parser import ToolCallParser, new_call_id

__all__ = ["FORMATS", "ToolCallParser", "ToolFormat", "chat_format", "chat_template", "detect_format", "generic_reply", "new_call_id", "new_parser",
           "partial_object", "prompt_inputs", "thought_ends", "tool_grammar", "tools_active", "unfinished_object"]
