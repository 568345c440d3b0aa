; Inno Setup script: a per-user installer (no admin rights) for the folder PyInstaller builds.
; On Windows, from the checkout, with the project installed in the active environment
; (pip install torch==2.13.0 && pip install -e ".[gui,package]"):
;
;   python -m PyInstaller --noconfirm --distpath dist --workpath build\pyinstaller packaging\swarmllm.spec
;   python packaging\smoke.py dist\swarmllm
;   iscc packaging\windows\swarmllm.iss        -> dist\SwarmLLM-Setup-0.1.0.exe
;
; Not built or run on this project's Linux CI machine: the recipe is here so a Windows build needs
; no guesswork, and is marked untested in docs/ARCHITECTURE.md.

#define AppVersion "0.1.0"

[Setup]
AppId={{6C2B0F4E-8E51-4C2B-9A7B-5D0A2C4E7F10}
AppName=SwarmLLM
AppVersion={#AppVersion}
AppPublisher=SwarmLLM
DefaultDirName={localappdata}\Programs\SwarmLLM
DefaultGroupName=SwarmLLM
PrivilegesRequired=lowest
OutputDir=..\..\dist
OutputBaseFilename=SwarmLLM-Setup-{#AppVersion}
SetupIconFile=swarmllm.ico
UninstallDisplayIcon={app}\swarmllm-tray.exe
Compression=lzma2/ultra64
SolidCompression=yes
ArchitecturesInstallIn64BitMode=x64compatible

[Files]
Source: "..\..\dist\swarmllm\*"; DestDir: "{app}"; Flags: recursesubdirs ignoreversion

[Tasks]
Name: "autostart"; Description: "Start SwarmLLM when I sign in"; GroupDescription: "Startup:"

[Icons]
Name: "{group}\SwarmLLM"; Filename: "{app}\swarmllm-tray.exe"
Name: "{userstartup}\SwarmLLM"; Filename: "{app}\swarmllm-tray.exe"; Tasks: autostart

[Run]
Filename: "{app}\swarmllm-tray.exe"; Description: "Start SwarmLLM now"; Flags: nowait postinstall skipifsilent
