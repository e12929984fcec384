"""Where the tests find the project's files, wherever in the test tree a test lives."""
import os

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # Megatron-DeepSpeed/
REPO_ROOT = os.path.dirname(PACKAGE_ROOT)
TOOLS = os.path.join(PACKAGE_ROOT, "tools")
DOCS = os.path.join(REPO_ROOT, "docs")
FIXTURES = os.path.join(PACKAGE_ROOT, "tests", "fixtures")  # stored checkpoints, upstream's flag sets
