import unittest

import keel_tool
import logic


class CountTest(unittest.TestCase):
    def test_counts_words_and_characters(self):
        self.assertEqual(logic.count("two words"), {"words": 2, "characters": 9})

    def test_refuses_a_text_over_the_limit(self):
        with self.assertRaises(ValueError):
            logic.count("a" * (logic.MAX_BYTES + 1))

    def test_the_schema_comes_from_the_annotations(self):
        _, spec = keel_tool.TOOLS["{{tool}}"]
        self.assertEqual(spec["input_schema"]["required"], ["text"])
        self.assertEqual(spec["input_schema"]["properties"]["text"]["type"], "string")
        self.assertEqual(spec["output_schema"]["required"], ["words", "characters"])


if __name__ == "__main__":
    unittest.main()
